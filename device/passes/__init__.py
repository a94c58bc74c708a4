"""Compiler passes over the device IR, in pipeline order: validate, then match.

    validate(graph, mode=..., profile=...) -> ValidationReport   (what --validate_only stops after)
    match(graph) -> list[Kernel]                                  (kernel matching)
"""

from device.passes.match import Kernel, match
from device.passes.validate import Finding, ValidationReport, validate

__all__ = ["Finding", "Kernel", "ValidationReport", "match", "validate"]
