"""Handlers of elementwise ops: arithmetic, casts, comparisons, logic, integer arithmetic, where.

Operands are cast to the result's dtype (scalars become constants of it), so integer
arithmetic stays in int32 / int64, exact: floor division and ``%`` are ``floor_div``,
truncating division and ``fmod`` are built from it and a select by signs.

Each handler takes the lowering, the FX node and the node's arguments by schema name
(``self`` spelled ``self_``), and returns the IR value name(s) of the node's result(s), or
None (``self.decline(reason)``) for a variant the device does not take. table.py maps the
aten ops onto them.
"""

from __future__ import annotations

import torch
import torch.fx

from device.capture.torch.lowering import _Lowering, _ir_dtype


def _elementwise(op: str, swap: bool = False):
    """add/sub/mul/div and friends: operands cast to the result dtype, alpha folded in.

    self op alpha * other; swapped (rsub): other op alpha * self.
    """
    def lower(self: _Lowering, node, self_, other, alpha=1, **_):
        shape, dtype = self.out(node)
        a, b = self.tensor(self_, dtype), self.tensor(other, dtype)
        if swap:
            a, b = b, a
        if alpha != 1:
            b = self.binary("mul", b, self.scalar(alpha, dtype))
        return self.emit(op, [a, b], shape, dtype)
    return lower


def _div(self: _Lowering, node, self_, other, rounding_mode=None, **_):
    if rounding_mode == "floor":
        return _floor_divide(self, node, self_, other)
    if rounding_mode == "trunc" and self.out(node)[1] in ("int32", "int64"):
        return _truncated(self, node, self_, other, "quotient")
    if rounding_mode is not None:
        return self.decline(f"rounding_mode={rounding_mode!r} (only None and 'floor')")
    return _elementwise("div")(self, node, self_, other)


def _unary(op: str, **attrs):
    def lower(self: _Lowering, node, self_, **_):
        shape, dtype = self.out(node)
        return self.emit(op, [self.tensor(self_, dtype)], shape, dtype, **attrs)
    return lower


def _identity(self: _Lowering, node, **args):
    return self.tensor(next(iter(args.values())))


def _detach(self: _Lowering, node, self_):
    """``x.detach()``: x, and no gradient flows back through it (the IR's identity marked stop_gradient, as
    tf.stop_gradient). Kept whole at capture: torch's decomposition makes it an ``alias``, which a full slice
    also becomes, and gradients do flow through that."""
    x = self.tensor(self_)
    return self.emit("identity", [x], self.shape(x), self.dtype(x), stop_gradient=True)


def _to_copy(self: _Lowering, node, self_, dtype=None, **_):
    return self.cast(self.tensor(self_), self.out(node)[1])


def _minimum(self: _Lowering, node, self_, other):
    # its own record (not -max(-a, -b), which overflows at an integer dtype's smallest value)
    shape, dtype = self.out(node)
    return self.emit("minimum", [self.tensor(self_, dtype), self.tensor(other, dtype)], shape, dtype)


def _pow(self: _Lowering, node, self_, exponent):
    shape, dtype = self.out(node)
    x = self.tensor(self_, dtype)
    if exponent == 1:
        return x
    if exponent == 2:
        return self.emit("square", [x], shape, dtype)
    if exponent == 3:
        return self.binary("mul", self.emit("square", [x], shape, dtype), x)
    if exponent == 0.5:
        return self.emit("sqrt", [x], shape, dtype)
    if exponent == -0.5:
        return self.emit("rsqrt", [x], shape, dtype)
    if exponent == -1:
        return self.emit("div", [self.scalar(1.0, dtype), x], shape, dtype)
    return self.decline(f"exponent={exponent}")


def _reciprocal(self: _Lowering, node, self_):
    shape, dtype = self.out(node)
    return self.emit("div", [self.scalar(1.0, dtype), self.tensor(self_, dtype)], shape, dtype)


def _compared_in(self_, other) -> str:
    """The IR dtype torch compares ``self_`` and ``other`` in: their promoted dtype."""
    left = self_.meta["val"].dtype
    if isinstance(other, torch.fx.Node):
        return _ir_dtype(torch.promote_types(left, other.meta["val"].dtype))
    if isinstance(other, float) and not left.is_floating_point:
        return _ir_dtype(torch.get_default_dtype())
    return _ir_dtype(left)


def _eq(self: _Lowering, node, self_, other):
    compare = _compared_in(self_, other)
    shape, dtype = self.out(node)
    return self.emit("equal", [self.tensor(self_, compare), self.tensor(other, compare)], shape, dtype)


def _where(self: _Lowering, node, condition, self_, other):
    """where(c, a, b) with c known at capture time (masked_fill with a mask buffer).

    With one computed branch and an infinite fill (a causal mask), it is x + (-inf where
    masked, 0 elsewhere): exact for finite x, and the additive mask that kernel matching
    recognises in attention. Otherwise the IR's where with the condition a constant, exact
    whatever the unchosen values are (an inf or NaN there never leaks, as it would through
    a multiply by a 0/1 mask).
    """
    if condition not in self.known:
        return _where_computed(self, node, condition, self_, other)
    shape, dtype = self.out(node)
    cond = self.known[condition].to(torch.bool)
    computed = [isinstance(b, torch.fx.Node) and b not in self.known for b in (self_, other)]
    if sum(computed) == 1:
        branch, fill, chosen = (other, self_, cond) if computed[1] else (self_, other, ~cond)
        value = torch.as_tensor(self.known[fill] if isinstance(fill, torch.fx.Node) else fill, dtype=torch.float64)
        filled = torch.where(chosen, value, torch.zeros((), dtype=torch.float64))
        if bool(torch.isinf(filled[chosen.expand_as(filled)]).all()):
            return self.emit("add", [self.tensor(branch, dtype), self.constant(filled.numpy(), dtype,
                                                                              f"{node.name}.fill")], shape, dtype)
    mask = self.constant(cond.numpy(), "bool", f"{node.name}.mask")
    return self.emit("where", [mask, self.tensor(self_, dtype), self.tensor(other, dtype)], shape, dtype)


def _where_computed(self: _Lowering, node, condition, self_, other):
    """where(c, a, b) with c computed from the batch (a padding mask): the IR's where."""
    shape, dtype = self.out(node)
    cond = self.tensor(condition)
    if self.dtype(cond) != "bool":
        return self.decline(f"a {self.dtype(cond)} condition (only bool)")
    return self.emit("where", [cond, self.tensor(self_, dtype), self.tensor(other, dtype)], shape, dtype)


# ---- comparisons and logic: masks, position buckets ----

def _comparison(op: str):
    def lower(self: _Lowering, node, self_, other):
        return _compare(self, node, op, self_, other)
    return lower


def _logical_op(op: str, bitwise: bool = False):
    def lower(self: _Lowering, node, self_, other=None):
        return (_bitwise if bitwise else _logical)(self, node, op, self_, other)
    return lower


def _compare(self: _Lowering, node, op: str, self_, other):
    """A comparison in the promoted dtype, as torch compares (the result is bool)."""
    compare = _compared_in(self_, other)
    shape, dtype = self.out(node)
    if compare == "bool" and op != "not_equal":  # an ordering of bools: False < True, as 0 < 1
        compare = "int64"
    return self.emit(op, [self.tensor(self_, compare), self.tensor(other, compare)], shape, dtype)


def _logical(self: _Lowering, node, op: str, self_, other=None):
    """logical_and/or/not: any dtype, nonzero is true (cast to bool first)."""
    shape, dtype = self.out(node)
    operands = [self.tensor(self_, "bool")] + ([] if other is None else [self.tensor(other, "bool")])
    return self.emit(op, operands, shape, dtype)


def _bitwise(self: _Lowering, node, op: str, self_, other=None):
    """~mask, mask & mask, mask | mask: logical ops on bool; on integers they are bit operations."""
    operands = [self_] + ([] if other is None else [other])
    kinds = {a.meta["val"].dtype for a in operands if isinstance(a, torch.fx.Node)}
    if kinds != {torch.bool}:
        return self.decline(f"bitwise operation on {', '.join(sorted(_ir_dtype(k) for k in kinds))} (only bool)",
                            form="integers")
    return _logical(self, node, op, self_, other)


def _xor(bitwise: bool):
    """logical_xor, and ``a ^ b`` on masks: not_equal of the two as bools (nonzero is true)."""
    def lower(self: _Lowering, node, self_, other):
        kinds = {a.meta["val"].dtype for a in (self_, other) if isinstance(a, torch.fx.Node)}
        if bitwise and kinds != {torch.bool}:
            return self.decline(f"bitwise operation on {', '.join(sorted(_ir_dtype(k) for k in kinds))} (only bool)",
                                form="integers")
        shape, dtype = self.out(node)
        return self.emit("not_equal", [self.tensor(self_, "bool"), self.tensor(other, "bool")], shape, dtype)
    return lower


def _floor(self: _Lowering, node, self_):
    shape, dtype = self.out(node)
    x = self.tensor(self_, dtype)
    return x if dtype not in ("float32", "float16", "bfloat16") else self.emit("floor", [x], shape, dtype)


def _floor_divide(self: _Lowering, node, self_, other):
    shape, dtype = self.out(node)
    a, b = self.tensor(self_, dtype), self.tensor(other, dtype)
    if dtype in ("int32", "int64"):
        return self.emit("floor_div", [a, b], shape, dtype)
    return self.emit("floor", [self.binary("div", a, b)], shape, dtype)


def _remainder(self: _Lowering, node, self_, other):
    """a % b with the divisor's sign, as torch and python: a - floor(a / b) * b."""
    shape, dtype = self.out(node)
    a, b = self.tensor(self_, dtype), self.tensor(other, dtype)
    if dtype in ("int32", "int64"):
        quotient = self.emit("floor_div", [a, b], shape, dtype)
    else:
        quotient = self.emit("floor", [self.binary("div", a, b)], shape, dtype)
    return self.emit("sub", [a, self.binary("mul", quotient, b)], shape, dtype)


# ---- integer arithmetic: truncating division and its remainder, exact on int32 / int64 ----

def _truncated(self: _Lowering, node, self_, other, result: str):
    """Integers: a / b rounded toward zero ("quotient", torch.div(rounding_mode="trunc")) or the
    remainder with the dividend's sign ("remainder", torch.fmod), from floor_div, never a float.

    q = a // b and r = a - q * b (r has b's sign); where r != 0 and r's sign is not a's (a and b
    have opposite signs), the truncated quotient is q + 1 and the remainder r - b.
    """
    shape, dtype = self.out(node)
    if dtype not in ("int32", "int64"):
        return self.decline(f"{str(node.target)} of {dtype} values (integers only: exact there)")
    a, b = self.tensor(self_, dtype), self.tensor(other, dtype)
    quotient = self.emit("floor_div", [a, b], shape, dtype)
    remainder = self.emit("sub", [a, self.binary("mul", quotient, b)], shape, dtype)
    zero = self.scalar(0, dtype)
    signs_differ = self.emit("not_equal", [self.emit("less", [remainder, zero], shape, "bool"),
                                           self.emit("less", [a, zero], self.shape(a), "bool")], shape, "bool")
    off = self.emit("logical_and", [self.emit("not_equal", [remainder, zero], shape, "bool"), signs_differ], shape,
                    "bool")
    if result == "quotient":
        return self.emit("add", [quotient, self.emit("where", [off, self.scalar(1, dtype), zero], shape, dtype)],
                         shape, dtype)
    return self.emit("sub", [remainder, self.emit("where", [off, b, zero], shape, dtype)], shape, dtype)


def _fmod(self: _Lowering, node, self_, other):
    return _truncated(self, node, self_, other, "remainder")
