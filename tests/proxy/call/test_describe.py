"""The record's view of a body sent unchanged: a request records its digest and no shape
(``of_unchanged``); a replay takes the shape from the inbound body (``of_raw``): the same
digests as the tree's, and the first differing member named."""

from __future__ import annotations

import json

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from projectionist.adapters.base import Site
from projectionist.policy.events import RequestRecorded
from projectionist.policy.model import ImageRef
from projectionist.proxy.call.describe import of_raw, of_unchanged, shape, site_paths
from projectionist.proxy.call.replay import locate

BODY = {"model": "m", "a/b~": 1, "messages": [{"role": "user", "content": "hi"}, {"role": "x", "content": [1, 2]}]}

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                       max_size=3), max_leaves=10)


@given(st.dictionaries(st.text(max_size=4), json_values, max_size=4))
def test_the_shape_of_bytes_is_the_shape_of_their_tree(body: dict[str, object]) -> None:
    for raw in (msgspec.json.encode(body), json.dumps(body, indent=2).encode()):
        assert of_raw(raw).shape == shape(msgspec.json.decode(raw))
        assert of_unchanged(raw) == msgspec.structs.replace(of_raw(raw), shape=())  # the same digest, no shape


def _resolve(root: object, pointer: str) -> object:
    node = root
    for token in pointer.split("/")[1:]:
        key = token.replace("~1", "/").replace("~0", "~")
        node = node[int(key)] if isinstance(node, list) else node[key]  # type: ignore[index]
    return node


def _slots(node: object) -> list[tuple[object, int | str]]:
    """Every (container, index) pair of a tree: each a place a site may name."""
    found: list[tuple[object, int | str]] = []
    if isinstance(node, dict):
        found += [(node, key) for key in node]
        for value in node.values():
            found += _slots(value)
    elif isinstance(node, list):
        found += [(node, index) for index in range(len(node))]
        for value in node:
            found += _slots(value)
    return found


@given(st.dictionaries(st.text(max_size=4), json_values, max_size=4), st.data())
def test_a_site_s_path_points_at_its_place_whatever_the_tree(body: dict[str, object], data: st.DataObject) -> None:
    """The walk stops once it found every site's container, and spells only their paths: each
    path still resolves to that very place, for any choice and order of sites."""
    tree = msgspec.json.decode(msgspec.json.encode(body))  # as a body comes: str keys, no shared objects
    slots = _slots(tree)
    chosen = data.draw(st.lists(st.sampled_from(slots), max_size=5)) if slots else []
    sites = [Site(parent, index, ImageRef("sha256:" + "0" * 64)) for parent, index in chosen]
    for site, path in zip(sites, site_paths(tree, sites), strict=True):
        parent, _, last = path.rpartition("/")
        assert _resolve(tree, parent) is site.parent  # containers are objects of their own
        assert last.replace("~1", "/").replace("~0", "~") == str(site.index)
    outside = Site([1], 0, ImageRef("sha256:" + "0" * 64))  # a container not in the tree has no path
    assert site_paths(tree, [outside]) == ["?/0"]


def test_a_pretty_printed_body_is_shaped_by_its_tree_and_paths() -> None:
    compact, pretty = msgspec.json.encode(BODY), json.dumps(BODY, indent=2).encode()
    assert [p for p, _ in of_raw(pretty).shape] == ["/model", "/a~1b~0", "/messages", "/messages/0", "/messages/1"]
    assert of_raw(pretty).shape == of_raw(compact).shape  # the tree's shape: whitespace does not count


def test_a_body_that_is_not_an_object_falls_back_to_the_tree_or_the_bytes() -> None:
    assert of_raw(b"[1, 2]").shape == shape([1, 2])
    assert [p for p, _ in of_raw(b"{bad").shape] == [""]


def test_a_changed_message_is_named_by_the_first_differing_path() -> None:
    changed = {**BODY, "messages": [BODY["messages"][0], {"role": "x", "content": [1, 3]}]}  # type: ignore[index]
    old, new = of_raw(msgspec.json.encode(BODY)), of_raw(msgspec.json.encode(changed))
    assert old.projected_digest != new.projected_digest
    recorded = RequestRecorded("r", "openai_chat", "openai_chat", "openai", "POST", "/v1/chat/completions", 0,
                               old.projected_digest, old.projected_digest, shape=old.shape)
    assert locate(recorded, new) == "/messages"  # the member, listed before its items
    assert [p for p, d in old.shape if dict(new.shape)[p] != d] == ["/messages", "/messages/1"]
