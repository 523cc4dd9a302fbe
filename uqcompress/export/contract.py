"""The deployment contract every exported ONNX graph follows, whatever the method.

Outputs (DESIGN.md): `member_logits [B, M, C]` (M = 1 for a single model), `probs [B, C]`
(mean of member softmaxes), `entropy [B]` (of `probs`), `mutual_info [B]` (entropy minus
mean member entropy; 0 for M = 1). Metadata travels in the ONNX model's metadata_props
under the keys below, JSON-encoded where structured.
"""

from __future__ import annotations

from uqcompress.engine.modality import IMAGE, TEXT
from uqcompress.uq.outputs import OUTPUT_FIELDS

OUTPUT_NAMES = OUTPUT_FIELDS  # the graph's outputs are the fields of the one record
# One more output for Hugging Face loaders (optimum's ORTModelFor*Classification and
# `pipeline` read `logits`): a single model's (temperature-scaled) logits; for an ensemble the
# log of the mean probabilities, so that softmax(logits) is `probs` and argmax agrees. The
# Predictor does not read it; exports before it lack it.
LOGITS_OUTPUT = "logits"
GRAPH_OUTPUTS = (*OUTPUT_NAMES, LOGITS_OUTPUT)
TEXT_INPUTS = TEXT.inputs  # the model's inputs, in the graph's order (engine/modality.py)
IMAGE_INPUTS = IMAGE.inputs

META_FORMAT = "uqc.format"  # contract version of this file
META_SOURCE_ID = "uqc.source_id"  # id of the model artifact that was exported
META_SOURCE_KIND = "uqc.source_kind"
META_LABELS = "uqc.labels"  # JSON list, class index -> name
META_INPUT_KIND = "uqc.input_kind"  # "text" or "image"
META_INPUT_NAMES = "uqc.input_names"  # JSON list
META_PREPROCESSING = "uqc.preprocessing"  # JSON object, see runtime.Preprocessing
META_MEMBERS = "uqc.members"  # M
META_AGGREGATION = "uqc.aggregation"  # how `probs` combines the members
AGGREGATION = "mean_probs"  # probs = mean over members of softmax(member_logits)

# Sampling models (DIRECTOR) take their random draws as an input, because ONNX Runtime's
# random numbers are not torch's: `noise` `[B, S, K, T, d]` standard normal (S samples, K
# steps, T tokens, d hidden). META_NOISE (JSON) has samples, steps, hidden, tokens (null for
# text: T is the padded length), the seed the Predictor uses when none is passed, and the
# scheme by which it draws each example's noise from that seed and the example's content
# (uq/noise.py: the same input gets the same draws in any batch, in torch and here).
NOISE_INPUT = "noise"
META_NOISE = "uqc.noise"

# `uqc calibrate`: JSON {"temperature": T, "abstain": {"score", "threshold", "coverage"}}.
# The temperature is already in the graph (member logits are divided by T); the abstention
# rule is applied by the Predictor: abstain when the named score exceeds the threshold.
META_CALIBRATION = "uqc.calibration"

# `uqc quantize`: JSON {"mode": "dynamic"|"static"|"fp16", "weights", "activations",
# "per_channel", "per_tensor_grouped", "calibration_method", "calibration_examples",
# "float32_tail", "excluded"}.
# Absent in a float32 export. The outputs and their types are the same in every mode.
META_QUANTIZATION = "uqc.quantization"

FORMAT_VERSION = "1"
TOKENIZER_FILE = "tokenizer.json"
ONNX_FILE = "model.onnx"
