"""Reductions of one kernel that share one pass over their rows.

Two reductions over the same space whose values do not depend on each other
(the mean and the mean of squares of batch-norm statistics, a row's sum and its
max) read the same elements: one loop with an accumulator each reads them once,
a loop each reads them twice (a looped row from memory both times). The tile
pass counts a kernel's passes over its rows by these groups (`row_reads`) and
loop-to-tile lowers each group as one loop; both read them here. Loads of one
element in a group's bodies are one read (`read_once`): tile-cse shares them.
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


def same_value(x: SSAValue, y: SSAValue, args: dict[SSAValue, SSAValue]) -> bool:
    """Whether two loop values compute the same thing (`args` pairs loop indices)."""
    pairs, seen = [(x, y)], set[tuple[SSAValue, SSAValue]]()
    while pairs:  # not recursive: an index chain may be thousands of ops long
        a, b = pairs.pop()
        if a is b or args.get(a) is b or (a, b) in seen:
            continue
        seen.add((a, b))
        oa, ob = a.owner, b.owner
        if not (isinstance(oa, Operation) and isinstance(ob, Operation)):
            return False
        if (
            oa.name != ob.name
            or oa.regions
            or ob.regions
            or dict(oa.properties) != dict(ob.properties)
            or [r.type for r in oa.results] != [r.type for r in ob.results]
            or len(oa.operands) != len(ob.operands)
        ):
            return False
        pairs.extend(zip(oa.operands, ob.operands, strict=True))
    return True


def read_once(loads: list[loop.LoadOp], kernel: loop.KernelOp) -> bool:
    """Whether `loads` (of one buffer) read each element once: there is one, or all
    read the same element in the bodies of one group's reductions, which one loop
    computes and whose loads tile-cse shares (batch-norm statistics load x twice)."""
    if len(loads) == 1:
        return True
    group_of = {op: id(group) for group in reduction_groups(kernel) for op in group}
    first = loads[0]
    home = first.parent_op()
    for other in loads[1:]:
        there = other.parent_op()
        if not (isinstance(home, loop.ReduceOp) and isinstance(there, loop.ReduceOp)):
            return False
        if home not in group_of or group_of.get(there) != group_of[home]:
            return False
        args = dict(zip(there.body.block.args, home.body.block.args, strict=True))
        indices = zip(other.indices, first.indices, strict=True)
        if not all(same_value(a, b, args) for a, b in indices):
            return False
    return True
