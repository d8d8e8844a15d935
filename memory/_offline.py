"""Keep every library this project imports off the network.

Imported first by each package that pulls in litellm, Chroma, transformers or
onnxruntime. The variables must be set before those libraries are imported:
litellm fetches a price list at import time, the Hugging Face hub looks for
model updates, and Chroma and onnxruntime send telemetry. They are forced, not
defaulted: a stray ``HF_HUB_OFFLINE=0`` in a user's shell must not make the
daemon download a model.
"""

import os

OFFLINE_ENVIRONMENT = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_DATASETS_OFFLINE": "1",
    "ORT_DISABLE_TELEMETRY": "1",
    "ANONYMIZED_TELEMETRY": "False",
    "TOKENIZERS_PARALLELISM": "false",
    "DO_NOT_TRACK": "1",
}

for _name, _value in OFFLINE_ENVIRONMENT.items():
    os.environ[_name] = _value
