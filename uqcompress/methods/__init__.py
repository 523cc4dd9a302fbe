"""Head scoring, selection and ensemble methods: pure math on nn.Modules and tensors."""
