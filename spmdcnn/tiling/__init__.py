"""Pure geometry of layer-wise parallelism: configurations, tile boxes, receptive fields, intersections and
plans (docs/architecture.md#layer-wise-parallelism, docs/formats.md#plan-files). No MPI and no CuPy: everything
here is plain Python on integers."""

from .boxes import Box, intersect, part, shape_of
from .config import ParallelConfig, dims_of, output_shape
from .plan import Plan, PlanError, load_plan

__all__ = ["Box", "intersect", "part", "shape_of", "ParallelConfig", "dims_of", "output_shape", "Plan", "PlanError",
           "load_plan"]
