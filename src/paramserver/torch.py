"""``paramserver.torch``: the import path of the PyTorch integration (its code is in
``integrations/torch.py`` and ``integrations/pipeline.py``; ``docs/torch.md``)."""

from paramserver.integrations.torch import (
    DenseParameters,
    Pipeline,
    PipelineError,
    ShardedEmbedding,
    ShardedEmbeddingBag,
    fit,
    pipeline,
    sharded_modules,
)

__all__ = ["DenseParameters", "Pipeline", "PipelineError", "ShardedEmbedding", "ShardedEmbeddingBag", "fit",
           "pipeline", "sharded_modules"]
