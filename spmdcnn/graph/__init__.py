"""Model YAML -> Graph of layer specs with global shapes, parameter specs and FLOPs."""

from .graph import Graph, Layer, load_model, parse_model

__all__ = ["Graph", "Layer", "load_model", "parse_model"]
