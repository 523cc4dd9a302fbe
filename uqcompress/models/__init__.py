"""Model families, loading/saving, tokenizer assets and tiny test models."""
