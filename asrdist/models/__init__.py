"""Acoustic models: DNN on spliced frames, (B)LSTM on chunks, BLSTM-CTC; built by name."""
from asrdist.models.ctc import BLANK, CTCModel
from asrdist.models.dnn import SWBD_FEATURE_DIM, SWBD_NUM_CLASSES, SplicedDNN
from asrdist.models.lstm import ChunkLSTM
from asrdist.models.registry import (
                                     MODEL_KINDS,
                                     MODEL_NAMES,
                                     ModelConfig,
                                     build_model,
                                     count_parameters,
                                     model_kind,
)

__all__ = [
    "BLANK", "CTCModel", "ChunkLSTM", "MODEL_KINDS", "MODEL_NAMES", "ModelConfig", "SWBD_FEATURE_DIM",
    "SWBD_NUM_CLASSES", "SplicedDNN", "build_model", "count_parameters", "model_kind",
]
