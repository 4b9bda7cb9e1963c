"""Reading libcst nodes: walking a tree, the text of a node, names, literals and source order.

Pure functions of the nodes they are given (position/before read the rule's position metadata);
rules, facts and fixes all share these instead of keeping their own copies."""

from __future__ import annotations

import dataclasses
import re
from array import array
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from itertools import chain, compress, repeat
from operator import add, attrgetter, is_not
from typing import TypeVar

import libcst as cst
from libcst.metadata import PositionProvider

_N = TypeVar("_N", bound=cst.CSTNode)

# Nodes whose bodies run at another time than the code around them.
SCOPE_NODES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)
# Exact types: `type(n) in S` / `type(n) is C` is a hash lookup or a pointer test, while an
# `isinstance` against libcst's node classes (ABCs) that fails is slow, and walks test every
# node. The same answer: no concrete libcst node class has subclasses.
SCOPE_TYPES = frozenset(SCOPE_NODES)


# ----- walking --------------------------------------------------------------------------------
class _FieldRecorder(cst.CSTVisitor):
    """Records the fields a node visits its children through, in the order it visits them."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: list[str] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        return False

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        self.fields.append(attribute)


_FIELD_ORDER: dict[type[cst.CSTNode], tuple[str, ...]] = {}


def _field_order(node: cst.CSTNode) -> tuple[str, ...]:
    """The fields of `node`'s class in source order, learned once per class from libcst itself
    (its visit announces every field, even an empty one, in the order it generates code)."""
    recorder = _FieldRecorder()
    node._visit_and_replace_children(recorder)
    visited = list(dict.fromkeys(recorder.fields))
    rest = [f.name for f in dataclasses.fields(node) if f.name not in visited]
    order = _FIELD_ORDER[type(node)] = (*visited, *rest)
    return order


# Per node class, its fields' values in source order in one call (a tuple, even for one field).
_FIELD_GETTERS: dict[type[cst.CSTNode], Callable[[cst.CSTNode], tuple[object, ...]]] = {}


def _field_getter(node: cst.CSTNode) -> Callable[[cst.CSTNode], tuple[object, ...]]:
    fields = _FIELD_ORDER.get(type(node)) or _field_order(node)
    if len(fields) == 1:
        one = attrgetter(fields[0])
        getter: Callable[[cst.CSTNode], tuple[object, ...]] = lambda n: (one(n),)  # noqa: E731
    elif fields:
        getter = attrgetter(*fields)  # type: ignore[assignment]
    else:
        getter = lambda n: ()  # noqa: E731
    _FIELD_GETTERS[type(node)] = getter
    return getter


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """`node.children` (its direct children in source order), read from the fields instead of
    rebuilding the node as `CSTNode.children` does: three times faster, and every walk of
    every rule pays it."""
    out: list[cst.CSTNode] = []
    node_types = _NODE_TYPES
    getter = _FIELD_GETTERS.get(type(node)) or _field_getter(node)
    for value in getter(node):
        kind = type(value)
        if kind is tuple or kind is list:
            for v in value:
                if type(v) in node_types or _is_node(type(v)):
                    out.append(v)
        elif kind in node_types or _is_node(kind):
            out.append(value)
    return out


# Classes seen in a tree that are node classes (a set: a failed `issubclass` against libcst's
# ABC is slow enough to show in every walk), and those that are not.
_NODE_TYPES: set[type] = set()
_OTHER_TYPES: set[type] = set()


def _is_node(kind: type) -> bool:
    """`issubclass(kind, cst.CSTNode)`, remembered in `_NODE_TYPES` / `_OTHER_TYPES`."""
    if kind in _OTHER_TYPES:
        return False
    if issubclass(kind, cst.CSTNode):
        _NODE_TYPES.add(kind)
        return True
    _OTHER_TYPES.add(kind)
    return False


# A field whose declared type is one of these never holds a node (`Name.value`, `Param.star`).
_NEVER_NODE = re.compile(
    r"<class 'str'>|<class 'bool'>|typing\.Optional\[str\]"
    r"|typing\.(Optional\[)?typing\.Literal\[[^\[\]]*\]\]?"
)
# Per node class, a function that pushes `(child, rank)` for each of a node's children onto the
# index's stack, last child first (so the first is visited next): `children(node)` reversed,
# written out per class (one `exec` per class) instead of looping over a tuple of its fields.
_PUSHERS: dict[type[cst.CSTNode], Callable[..., None]] = {}


def _pusher(node: cst.CSTNode) -> Callable[..., None]:
    kind = type(node)
    declared = {f.name: str(f.type) for f in dataclasses.fields(node)}
    lines = ["def push_children(n, here, push, node_types, other_types, is_node):", "    pass"]
    for name in reversed(_FIELD_ORDER.get(kind) or _field_order(node)):
        if _NEVER_NODE.fullmatch(declared.get(name, "")):
            continue
        lines += [
            f"    v = n.{name}",
            "    t = type(v)",
            "    if t is tuple or t is list:",
            "        for x in reversed(v):",
            "            tx = type(x)",
            "            if tx in node_types or (tx not in other_types and is_node(tx)):",
            "                push((x, here))",
            "    elif t in node_types or (t not in other_types and is_node(t)):",
            "        push((v, here))",
        ]
    scope: dict[str, Callable[..., None]] = {}
    exec("\n".join(lines), scope)  # noqa: S102 - our own code, from libcst's field names
    pusher = _PUSHERS[kind] = scope["push_children"]
    return pusher


# The recursive walk `_preorder` makes a fresh tree's index with: per node class, a function
# that records the node (its rank, parent and, once its children are done, its end) and goes
# into each child in source order; a child of a class without node fields (the whitespace
# leaves, 40% of a tree) is recorded in place, without a call. One Python call per inner node,
# and the ends come with the walk (the iterative walk pushes and pops every node, then makes
# the ends in a second pass over all of them).
_INDEXERS: dict[type[cst.CSTNode], Callable[[cst.CSTNode, int], None]] = {}
_LEAF_TYPES: set[type[cst.CSTNode]] = set()  # node classes with no field that holds a node
# The indexers' globals: the lists of the tree being walked (set for each walk) and the tables.
_SCOPE: dict[str, object] = {}


def _indexer(node: cst.CSTNode) -> Callable[[cst.CSTNode, int], None]:
    kind = type(node)
    declared = {f.name: str(f.type) for f in dataclasses.fields(node)}
    fields = [
        name
        for name in (_FIELD_ORDER.get(kind) or _field_order(node))
        if not _NEVER_NODE.fullmatch(declared.get(name, ""))
    ]
    if not fields:
        _LEAF_TYPES.add(kind)
    lines = [
        "def index(n, up):",
        "    here = len(nodes)",
        "    add_node(n)",
        "    add_up(up)",
        "    add_end(0)",
    ]
    for name in fields:
        # (tuples and lists are no node classes: testing them after those is the same test)
        lines += [
            f"    v = n.{name}",
            "    t = type(v)",
            "    if t in leaf_types:",
            "        add_node(v)",
            "        add_up(here)",
            "        add_end(len(nodes))",
            "    elif t in node_types:",
            "        (indexers.get(t) or make(v))(v, here)",
            "    elif t is tuple or t is list:",
            "        for x in v:",
            "            tx = type(x)",
            "            if tx in leaf_types:",
            "                add_node(x)",
            "                add_up(here)",
            "                add_end(len(nodes))",
            "            elif tx in node_types or (tx not in other_types and is_node(tx)):",
            "                (indexers.get(tx) or make(x))(x, here)",
            "    elif t not in other_types and is_node(t):",
            "        (indexers.get(t) or make(v))(v, here)",
        ]
    lines.append("    ends[here] = len(nodes)")
    exec("\n".join(lines), _SCOPE)  # noqa: S102 - our own code, from libcst's field names
    index = _INDEXERS[kind] = _SCOPE.pop("index")  # type: ignore[assignment]
    return index  # type: ignore[return-value]


def _preorder(
    root: cst.CSTNode, previous: Preorder | None = None, shared: Mapping[int, int] | None = None
) -> tuple[list[cst.CSTNode], array[int], array[int]] | None:
    """(nodes in preorder, each one's parent's rank, each one's end) of `root`'s tree, from the
    indexers; None for a tree nested deeper than the recursion allows (the iterative walk
    indexes it, in the same order). `shared`: id -> rank in `previous` of children of `root`
    whose subtrees are copied from `previous` (shifted) instead of walked: the same nodes in
    the same order, nodes being immutable."""
    nodes: list[cst.CSTNode] = []
    ups, ends = array("i"), array("i")
    _SCOPE.update(
        nodes=nodes,
        ends=ends,
        add_node=nodes.append,
        add_up=ups.append,
        add_end=ends.append,
        leaf_types=_LEAF_TYPES,
        node_types=_NODE_TYPES,
        other_types=_OTHER_TYPES,
        is_node=_is_node,
        indexers=_INDEXERS,
        make=_indexer,
    )
    try:
        if shared and previous is not None:
            nodes.append(root)
            ups.append(-1)
            ends.append(0)
            for child in children(root):
                start = shared.get(id(child))
                if start is None:
                    (_INDEXERS.get(type(child)) or _indexer(child))(child, 0)
                    continue
                stop, shift = previous.end[start], len(nodes) - start
                nodes.extend(previous.nodes[start:stop])
                ups.append(0)
                ups.extend(map(add, previous.up[start + 1 : stop], repeat(shift)))
                ends.extend(map(add, previous.end[start:stop], repeat(shift)))
            ends[0] = len(nodes)
        else:
            (_INDEXERS.get(type(root)) or _indexer(root))(root, -1)
    except RecursionError:
        return None
    finally:  # the scope must not keep the tree alive
        for name in ("nodes", "ends", "add_node", "add_up", "add_end"):
            _SCOPE.pop(name, None)
    return nodes, ups, ends


# A tree of this many nodes (a module of about 13,000 lines) keeps its ranks in `SortedRanks`.
COMPACT_RANKS_FROM = 250_000


class SortedRanks(Mapping[int, int]):
    """`id(node) -> rank` as two arrays sorted by id, 12 bytes an entry, where a dict with its
    int objects takes about 100: on a 50k-line file (550k ranked nodes) 7 MB instead of 55,
    held until the file's last rule is done. A lookup is a binary search (slower than a dict's
    hash: used only for trees past `COMPACT_RANKS_FROM` nodes)."""

    __slots__ = ("_ids", "_ranks")

    def __init__(self, ids: Iterable[int], ranks: Iterable[int]) -> None:
        unsorted_ids, unsorted_ranks = array("Q", ids), array("i", ranks)
        order = sorted(range(len(unsorted_ids)), key=unsorted_ids.__getitem__)
        self._ids = array("Q", map(unsorted_ids.__getitem__, order))
        self._ranks = array("i", map(unsorted_ranks.__getitem__, order))

    def get(self, key: int, default: int | None = None) -> int | None:  # type: ignore[override]
        ids = self._ids
        at = bisect_left(ids, key)
        return self._ranks[at] if at < len(ids) and ids[at] == key else default

    def __getitem__(self, key: int) -> int:
        rank = self.get(key)
        if rank is None:
            raise KeyError(key)
        return rank

    def __contains__(self, key: object) -> bool:
        return isinstance(key, int) and self.get(key) is not None

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)


class Preorder:
    """A whole tree in source order (preorder) with each node's parent: walking it or any of
    its subtrees is then a slice of one list instead of a fresh descent. Keyed by `id()` (a
    node's own `__hash__` is a Python call); `nodes` keeps every node alive, so ids stay unique.

    One dict entry per node but whitespace (`rank`, see `rank_of`; `SortedRanks` for a very
    large tree); parents and subtree ends
    are ranks in typed arrays (4 bytes a node), not dicts or lists of int objects: a 50k-line
    file has a million nodes, and a dict of them with its int keys and values is 100 MB."""

    def __init__(self, root: cst.CSTNode, previous: Preorder | None = None) -> None:
        """`previous`: the index of another tree, which may share whole top-level statements
        with `root` (a rewrite's edited module keeps the statements no fix rebuilt): those are
        copied from it, slices of its arrays, instead of walked node by node again."""
        nodes: list[cst.CSTNode] = []
        up_ranks = array("i")
        stack: list[tuple[cst.CSTNode, int]] = [(root, -1)]
        pop, push, add_node, add_up = stack.pop, stack.append, nodes.append, up_ranks.append
        pushers, node_types, other_types = _PUSHERS, _NODE_TYPES, _OTHER_TYPES
        shared = _shared_statements(root, previous)
        copied: list[tuple[int, int, int]] = []  # (rank here, start, stop in `previous`)
        built = _preorder(root, previous, shared)
        if built is not None:
            nodes, up_ranks, ends = built
            stack.clear()
        while stack:  # the iterative walk: a tree sharing statements, or one nested too deep
            node, up = pop()
            here = len(nodes)
            if shared and id(node) in shared:
                assert previous is not None
                start = shared[id(node)]
                stop = previous.end[start]
                nodes.extend(previous.nodes[start:stop])
                add_up(up)
                up_ranks.extend(map(add, previous.up[start + 1 : stop], repeat(here - start)))
                copied.append((here, start, stop))
                continue
            add_node(node)
            add_up(up)
            pusher = pushers.get(type(node)) or _pusher(node)
            pusher(node, here, push, node_types, other_types, _is_node)
        self.nodes = nodes
        self._types = types = list(map(type, nodes))
        # id(node) -> rank, for every node but the whitespace (see `rank_of`).
        ranked = map(is_not, types, repeat(cst.SimpleWhitespace))
        self.rank: Mapping[int, int]
        if len(nodes) >= COMPACT_RANKS_FROM:
            kept = array("i", compress(range(len(nodes)), ranked))
            self.rank = SortedRanks(map(id, map(nodes.__getitem__, kept)), kept)
        else:
            ids_and_ranks = zip(map(id, nodes), range(len(nodes)), strict=True)
            self.rank = dict(compress(ids_and_ranks, ranked))
        self._whitespace_rank: dict[int, int] | None = None
        # up[i]: the rank of node i's parent (-1 for the root).
        self.up = up_ranks
        # end[i]: the rank just after node i's last descendant (descendants come after it).
        if built is not None:
            self.end = ends
        elif copied:
            self.end = end = array("i", range(1, len(nodes) + 1))
            _copy_ends(end, up_ranks, previous, copied)  # type: ignore[arg-type]
        else:
            self.end = end = array("i", range(1, len(nodes) + 1))
            for i in range(len(nodes) - 1, 0, -1):
                up = up_ranks[i]
                if end[i] > end[up]:
                    end[up] = end[i]
        self._ranks_of_type: dict[type | tuple[type, ...], array[int]] = {}
        self._ranks_by_type: defaultdict[type, list[int]] | None = None

    def rank_of(self, node: cst.CSTNode) -> int | None:
        """`node`'s rank in source order; None for a node of another tree. `rank` leaves out
        the `SimpleWhitespace` leaves, 40% of a tree's nodes, that no rule asks about by
        identity: asking about one makes their own table then."""
        rank = self.rank.get(id(node))
        if rank is None and type(node) is cst.SimpleWhitespace:
            if self._whitespace_rank is None:
                ranks = self.ranks_of_type(cst.SimpleWhitespace)
                self._whitespace_rank = {id(self.nodes[r]): r for r in ranks}
            rank = self._whitespace_rank.get(id(node))
        return rank

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        """The parents of `node` (a node of this tree), innermost first, up to the root."""
        rank, nodes, up = self.rank_of(node), self.nodes, self.up
        if rank:
            rank = up[rank]
            while rank >= 0:
                yield nodes[rank]
                rank = up[rank]

    def walk(self, node: cst.CSTNode, into_scopes: bool) -> Iterator[cst.CSTNode]:
        start = self.rank[id(node)]
        stop = self.end[start]
        if into_scopes:
            return iter(self.nodes[start:stop])  # a list's iterator: no Python frame per node
        nodes = self.nodes
        return chain.from_iterable(nodes[lo:hi] for lo, hi in self._outside_scopes(start, stop))

    def _outside_scopes(self, start: int, stop: int) -> list[tuple[int, int]]:
        """The rank ranges of the subtree [start, stop) without the insides of the scopes
        below its root (a function, class or lambda is kept, its body left out): a walk
        outside scopes is then a few slices, not a step per node."""
        scopes = self.ranks_of_type(SCOPE_NODES)
        end = self.end
        ranges = []
        lo = start + 1
        j = bisect_left(scopes, lo)
        while j < len(scopes) and scopes[j] < stop:
            scope = scopes[j]
            ranges.append((lo, scope + 1))
            lo = end[scope]
            j = bisect_left(scopes, lo, j + 1)
        ranges.append((lo, stop))
        ranges[0] = (start, ranges[0][1])
        return ranges

    def ranks_of_type(
        self, kind: type[cst.CSTNode] | tuple[type[cst.CSTNode], ...]
    ) -> Sequence[int]:
        """The ranks of the whole tree's nodes of class `kind` (or of a tuple's classes), in
        order; made on the first asking. A tree asks about ten such questions: one pass that
        groups every rank by its node's class answers them all (a tuple's classes merged) for
        less than two passes in C of one question each. A tree past `COMPACT_RANKS_FROM`
        nodes takes a pass per question instead: its groups, as int objects, would hold about
        35 bytes a node."""
        ranks = self._ranks_of_type.get(kind)
        if ranks is None:
            kinds = frozenset(kind if isinstance(kind, tuple) else (kind,))
            types = self._types
            if len(types) >= COMPACT_RANKS_FROM:
                found = compress(range(len(types)), map(kinds.__contains__, types))
            else:
                groups = self._ranks_by_type
                if groups is None:
                    groups = self._ranks_by_type = defaultdict(list)
                    for rank, node_type in enumerate(types):
                        groups[node_type].append(rank)
                parts = [groups[k] for k in kinds if k in groups]
                found = parts[0] if len(parts) == 1 else sorted(chain.from_iterable(parts))
            ranks = self._ranks_of_type[kind] = array("i", found)
        return ranks

    def ranks_of_named(self, names: AbstractSet[str]) -> Sequence[int]:
        """The ranks of the nodes whose class is called one of `names` (`Call`, `If`), in
        order: the only nodes a batched visit with methods for those classes needs to stop at."""
        kinds = tuple(k for k in set(self._types) if k.__name__ in names)
        if not kinds:
            return ()
        return self.ranks_of_type(kinds[0] if len(kinds) == 1 else kinds)

    def of_type(
        self,
        node: cst.CSTNode,
        kind: type[cst.CSTNode] | tuple[type[cst.CSTNode], ...],
        into_scopes: bool = True,
    ) -> list[cst.CSTNode]:
        """The nodes of class `kind` (or of any class of a tuple) in `node`'s subtree, in
        source order (from a list of ranks per question, made on its first asking); without
        `into_scopes`, not those inside the functions, classes and lambdas below `node`."""
        ranks = self.ranks_of_type(kind)
        start = self.rank[id(node)]
        get = self.nodes.__getitem__
        if into_scopes:
            found = ranks[bisect_left(ranks, start) : bisect_left(ranks, self.end[start])]
            return list(map(get, found))
        out: list[cst.CSTNode] = []
        for lo, hi in self._outside_scopes(start, self.end[start]):
            out.extend(map(get, ranks[bisect_left(ranks, lo) : bisect_left(ranks, hi)]))
        return out

    def contains(self, outer: cst.CSTNode, inner: cst.CSTNode) -> bool | None:
        """`inner` is `outer` or one of its descendants; None when either is not in the tree."""
        start = self.rank.get(id(outer))
        at = self.rank_of(inner)  # `inner` may be whitespace
        if start is None or at is None:
            return None
        return start <= at < self.end[start]


def _shared_statements(root: cst.CSTNode, previous: Preorder | None) -> dict[int, int]:
    """id -> rank in `previous` of the top-level statements of `root` (a module) that
    `previous` indexes. Nodes are immutable, so such a statement's subtree there is its subtree
    here; `previous` keeps its nodes alive, so their ids are no other node's."""
    if previous is None or type(root) is not cst.Module:
        return {}
    ranks = previous.rank
    found = {}
    for statement in root.body:  # type: ignore[attr-defined]
        rank = ranks.get(id(statement))
        if rank is not None:
            found[id(statement)] = rank
    return found


def _copy_ends(
    end: array[int], up: array[int], previous: Preorder, copied: list[tuple[int, int, int]]
) -> None:
    """`Preorder.end` for a tree with subtrees copied from `previous` (`copied`: their ranks
    here, and start and stop there): the copied nodes' ends are theirs there, shifted; every
    other node's end grows to its last descendant's, as in `Preorder`, with each copied
    subtree passed up by its root alone."""
    root_of_last: dict[int, int] = {}
    for here, start, stop in copied:
        shift = here - start
        end[here : here + stop - start] = array(
            "i", map(add, previous.end[start:stop], repeat(shift))
        )
        root_of_last[here + stop - start - 1] = here
    i = len(end) - 1
    while i > 0:
        i = root_of_last.get(i, i)
        parent = up[i]
        if end[i] > end[parent]:
            end[parent] = end[i]
        i -= 1


# The tree being analysed (see `index_tree`): walks of its nodes read its preorder.
_current: Preorder | None = None


def index_tree(root: cst.CSTNode) -> Preorder:
    """Index `root` in preorder and make `walk` use that index for its nodes (until the next
    tree is indexed). Nodes of other trees are walked as usual; the top-level statements that
    the tree indexed before holds too (a rewrite's next text) are copied from its index."""
    global _current
    _current = Preorder(root, _current)
    return _current


def indexed_tree(root: cst.CSTNode) -> Preorder | None:
    """The index of `root`'s tree if it is the one indexed last (see `index_tree`), else None."""
    tree = _current
    return tree if tree is not None and tree.nodes[0] is root else None


def walk(node: cst.CSTNode, *, into_scopes: bool = True) -> Iterator[cst.CSTNode]:
    """`node` and its descendants, in source order. `into_scopes=False` does not enter nested
    functions, classes or lambdas (their bodies run at another time)."""
    tree = _current
    if tree is not None and id(node) in tree.rank:
        return tree.walk(node, into_scopes)
    return _descend(node, into_scopes)


def _descend(node: cst.CSTNode, into_scopes: bool) -> Iterator[cst.CSTNode]:
    stack = [node]
    while stack:
        cur = stack.pop()
        yield cur
        if not into_scopes and cur is not node and type(cur) in SCOPE_TYPES:
            continue
        stack.extend(reversed(children(cur)))


def nodes_of_type(
    node: cst.CSTNode, kind: type[_N] | tuple[type[_N], ...], *, into_scopes: bool = True
) -> list[_N]:
    """Every node of class `kind` (a concrete node class, or a tuple of them) in `node`'s
    subtree, `node` included, in source order: `[n for n in walk(node) if isinstance(n, kind)]`
    (`into_scopes` as for `walk`), read off the index for a node of the indexed tree."""
    tree = _current
    if tree is not None and id(node) in tree.rank:
        return tree.of_type(node, kind, into_scopes)  # type: ignore[return-value]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return [n for n in _descend(node, into_scopes) if type(n) in kinds]  # type: ignore[misc]


def calls_in(node: cst.CSTNode, *, into_scopes: bool = True) -> Iterator[cst.Call]:
    """Every call under `node` (see `walk`)."""
    return iter(nodes_of_type(node, cst.Call, into_scopes=into_scopes))


def contains(outer: cst.CSTNode, inner: cst.CSTNode) -> bool:
    """`inner` is `outer` or one of its descendants (by identity)."""
    tree = _current
    if tree is not None:
        inside = tree.contains(outer, inner)
        if inside is not None:
            return inside
    return any(n is inner for n in walk(outer))


def position(rule: cst.MetadataDependent, node: cst.CSTNode) -> tuple[int, int]:
    """(line, column) where `node` starts, for ordering nodes in source order (`rule`: a rule,
    or any visitor that resolved `PositionProvider`)."""
    pos = rule.get_metadata(PositionProvider, node)
    return pos.start.line, pos.start.column


def before(rule: cst.MetadataDependent, a: cst.CSTNode, b: cst.CSTNode) -> bool:
    """`a` starts before `b` in the file."""
    return position(rule, a) < position(rule, b)


# ----- text and names -------------------------------------------------------------------------
def code_of(node: cst.CSTNode) -> str:
    """The source text of `node`."""
    return cst.Module(body=[]).code_for_node(node)


def dotted(expr: cst.CSTNode | None) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    kind = type(expr)  # exact types: asked of most nodes a rule looks at (see `SCOPE_TYPES`)
    if kind is cst.Name:
        return expr.value  # type: ignore[union-attr]
    if kind is cst.Attribute:
        base = dotted(expr.value)  # type: ignore[union-attr]
        return None if base is None else f"{base}.{expr.attr.value}"  # type: ignore[union-attr]
    return None


def names_in(node: cst.CSTNode) -> set[str]:
    """Every plain name read or written in `node`."""
    return {n.value for n in nodes_of_type(node, cst.Name)}


def root_name(expr: cst.BaseExpression) -> str | None:
    """`batch["x"][0].foo` -> "batch"."""
    while isinstance(expr, cst.Subscript | cst.Attribute):
        expr = expr.value
    return expr.value if isinstance(expr, cst.Name) else None


def method_name(call: cst.Call) -> str | None:
    """`x.foo(...)` -> "foo"."""
    return call.func.attr.value if type(call.func) is cst.Attribute else None  # type: ignore[attr-defined]


def is_name(expr: cst.CSTNode | None, value: str) -> bool:
    """`expr` is the plain name `value`."""
    return type(expr) is cst.Name and expr.value == value  # type: ignore[union-attr]


def assignments(node: cst.CSTNode) -> Iterator[tuple[str, cst.BaseExpression, cst.Assign]]:
    """`(target text, value, assign)` for every single-target-per-`=` assignment under `node`
    (not descending into nested functions/classes)."""
    for n in walk(node, into_scopes=False):
        if type(n) is cst.Assign:
            for target in n.targets:
                name = dotted(target.target)
                if name is not None:
                    yield name, n.value, n


# ----- literals -------------------------------------------------------------------------------
def is_true(expr: cst.BaseExpression | None) -> bool:
    """`expr` is the literal `True`."""
    return is_name(expr, "True")


def int_literal(expr: cst.BaseExpression | None) -> int | None:
    """The value of an integer literal."""
    if isinstance(expr, cst.Integer):
        return int(expr.value, 0)
    return None


def string_value(expr: cst.BaseExpression | None) -> str | None:
    """The value of a plain string literal."""
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        return value if isinstance(value, str) else None
    return None


def int_constants(module: cst.Module) -> dict[str, tuple[int, cst.BaseExpression]]:
    """Names bound once, at module or class level, to an integer literal (`VOCAB = 50257`,
    `vocab_size: int = 50257`): name -> (value, the literal node)."""
    found: dict[str, list[cst.BaseExpression]] = {}
    for stmt in walk(module, into_scopes=False):
        if isinstance(stmt, cst.ClassDef):
            for inner in walk(stmt.body, into_scopes=False):
                _collect_binding(inner, found)
        else:
            _collect_binding(stmt, found)
    out: dict[str, tuple[int, cst.BaseExpression]] = {}
    for name, values in found.items():
        value = int_literal(values[0]) if len(values) == 1 else None
        if value is not None:
            out[name] = (value, values[0])
    return out


def bound_once_at_top(module: cst.Module, name: str) -> cst.BaseExpression | None:
    """The value `name` is bound to at `module`'s top level, when it is bound there once
    (`net_G_models = {...}`, `gpus = [0]`)."""
    found: dict[str, list[cst.BaseExpression]] = {}
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                _collect_binding(small, found)
    values = found.get(name, [])
    return values[0] if len(values) == 1 else None


def _collect_binding(node: cst.CSTNode, found: dict[str, list[cst.BaseExpression]]) -> None:
    if isinstance(node, cst.Assign) and len(node.targets) == 1:
        target, value = node.targets[0].target, node.value
    elif isinstance(node, cst.AnnAssign) and node.value is not None:
        target, value = node.target, node.value
    else:
        return
    if isinstance(target, cst.Name):
        found.setdefault(target.value, []).append(value)


def top_level_imports(
    module: cst.Module,
) -> Iterator[tuple[cst.SimpleStatementLine, cst.ImportAlias]]:
    """Every `import a.b [as c]` alias at the top level of `module`, with its statement line."""
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Import):
                    for alias in small.names:
                        yield stmt, alias
