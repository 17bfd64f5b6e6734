"""The model-spec side of the PyTorch DLRM reference (bench/pytorch/dlrm_reference.py --model-spec FILE).

  spec.py   parses and checks a model spec (docs/model-spec.md), refusing bad ones with a message naming the field
  data.py   reads Criteo-format TSV into per-table rows and EmbeddingBag bags (multi-hot fields: tokens split by |)
  model.py  the DLRM a spec describes: per-table EmbeddingBag weights, dot or DCNv2 interaction, the MLPs
"""
