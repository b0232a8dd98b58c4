"""Reductions of one kernel that share one pass over their rows.

Two reductions over the same space whose values do not depend on each other
(the mean and the mean of squares of batch-norm statistics, a row's sum and its
max) read the same elements: one loop with an accumulator each reads them once,
a loop each reads them twice (a looped row from memory both times). The tile
pass counts a kernel's passes over its rows by these groups (`row_reads`) and
loop-to-tile lowers each group as one loop; both read them here.
"""

from __future__ import annotations

from xdsl.ir import Operation, SSAValue

from irc.dialects import loop


def loops_read(op: loop.ReduceOp, kernel: loop.KernelOp) -> set[Operation]:
    """The loops of `kernel` (reductions, foreach) whose results `op`'s body reads,
    directly or through other values of the kernel."""
    inside = set(op.body.walk())
    found: set[Operation] = set()
    seen: set[SSAValue] = set()
    stack = [v for o in inside for v in o.operands]
    while stack:  # not recursive: an index chain may be thousands of ops long
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        owner = v.owner
        if not isinstance(owner, Operation) or owner in inside or not kernel.is_ancestor(owner):
            continue  # an index, the function's buffers, a value of `op`'s own body
        if isinstance(owner, loop.LOOPS):
            found.add(owner)
        else:
            stack.extend(owner.operands)
    return found


def reduction_groups(kernel: loop.KernelOp) -> list[list[loop.ReduceOp]]:
    """The plain reductions (not contractions) of the kernel's own block, in groups
    that one loop computes, each in block order.

    A reduction joins the group of an earlier one over the same bounds when every
    loop it reads comes before that group's first member (so it reads no member's
    result, and nothing the loop would have to compute first) and it loads no
    buffer the kernel stores (moved ahead of that store, it would read old values).
    """
    block = kernel.body.block
    position = {op: i for i, op in enumerate(block.ops)}
    stored = {s.buffer for s in kernel.body.walk() if isinstance(s, loop.StoreOp)}
    groups: list[list[loop.ReduceOp]] = []
    for op in block.ops:
        if not isinstance(op, loop.ReduceOp) or op.contract is not None:
            continue
        reads_stored = any(
            isinstance(load, loop.LoadOp) and load.buffer in stored for load in op.body.walk()
        )
        read = loops_read(op, kernel)
        for group in groups:
            first = group[0]
            if (
                not reads_stored
                and loop.int_list(first.bounds) == loop.int_list(op.bounds)
                and all(position.get(r, -1) < position[first] for r in read)
            ):
                group.append(op)
                break
        else:
            groups.append([op])
    return groups
