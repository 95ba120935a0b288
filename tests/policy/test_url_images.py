"""Images the provider fetches by URL, in the pure policy: the URL's identity and display name,
which URL images a "could not fetch" answer is about, the quarantine that records it, what later
requests get for it, how it folds, checkpoints and decodes on an older replica, and that no probe
or store read ever reaches it."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from projectionist.policy.decide import Ask, Done, Progress, decide, held_urls
from projectionist.policy.events import Quarantine, Rejected, decode_event, encode_event, envelope
from projectionist.policy.fold import EMPTY, SessionState, checkpoint_of, fold
from projectionist.policy.linked import is_web_url, url_id, url_name
from projectionist.policy.model import ImageRef, Placeholder, is_valid_id
from projectionist.policy.probe import Prober
from projectionist.policy.profile import Rejection
from projectionist.policy.rejection import unfetched, unreachable

SIGNED = "https://bucket.s3.amazonaws.com/u/1/cat.png?X-Amz-Expires=300&X-Amz-Signature=5f1e0c6a9d"
RESIGNED = "https://bucket.s3.amazonaws.com/u/1/cat.png?X-Amz-Expires=300&X-Amz-Signature=77aa01"
PLAIN = "https://cdn.example/photos/dog.jpg"


# --- identity and name ------------------------------------------------------------------------

def test_a_urls_identity_is_deterministic_one_way_and_never_an_images() -> None:
    aid = url_id(SIGNED)
    assert aid == url_id(SIGNED) and is_valid_id(aid)
    assert aid == "sha256:" + hashlib.sha256(b"projectionist image url v1\0" + SIGNED.encode()).hexdigest()
    assert aid != "sha256:" + hashlib.sha256(SIGNED.encode()).hexdigest()  # not the digest of the URL's bytes
    assert url_id(RESIGNED) != aid  # a re-signed link is another text: tried anew
    assert "5f1e0c6a9d" not in aid
    assert url_id("https://x/\ud800.png").startswith("sha256:")  # any JSON string, lone surrogates too


@pytest.mark.parametrize(("url", "name"), [
    (SIGNED, "cat.png"),
    ("https://cdn.example/a%20b.JPEG#frag", "a b.JPEG"),
    ("https://cdn.example/img/", None),
    ("https://cdn.example/download/4f9a1c2b7e", None),  # an opaque token: never shown or recorded
    ("https://api.telegram.org/file/bot123:SECRET/photos/file_1.jpg", "file_1.jpg"),
    ("https://cdn.example/%ff%fe.png", None),  # a %-escape that is no UTF-8
    ("https://[::1/x.png", None),  # no URL
    ("https://cdn.example/" + "n" * 120 + ".png", None),
])
def test_the_display_name_is_an_image_files_name_or_none(url: str, name: str | None) -> None:
    assert url_name(url) == name


def test_web_urls_are_http_and_https_in_any_case() -> None:
    assert is_web_url(SIGNED) and is_web_url("HTTP://x/a.png") and is_web_url("Https://x")
    assert not any(is_web_url(u) for u in ("attachment:sha256:aa", "data:image/png;base64,x", "gs://b/a.png",
                                           "ftp://x/a.png", "files/abc", ""))


# --- which URL images an answer is about --------------------------------------------------------

A, B, C = url_id(SIGNED), url_id(PLAIN), url_id(SIGNED.split("?")[0])
LINKED = [("/messages/0/content/1/image_url/url", A, SIGNED), ("/messages/1/content/0/image_url/url", B, PLAIN),
          ("/messages/2/content/3/image_url/url", C, SIGNED.split("?")[0]),
          ("/messages/3/content/0/image_url/url", A, SIGNED)]


def test_a_named_site_is_exact() -> None:
    assert unreachable(Rejection("x", "/messages/1/content/0", "not_found"), LINKED) == (B,)
    assert unreachable(Rejection("x", "/messages/1", "not_found"), LINKED) == (B,)  # the message holding it
    assert unreachable(Rejection("x", "/messages/9/content/0", "not_found"), LINKED) == ()  # no URL image there
    assert unreachable(Rejection("x", "/messages/0/content/10", "not_found"), LINKED) == ()  # a prefix is no parent


def test_a_quoted_url_is_exact_and_the_longest_of_nested_spellings_wins() -> None:
    assert unreachable(Rejection(f"Error while downloading {PLAIN}.", None, "not_found"), LINKED) == (B,)
    # the signed URL's unsigned prefix is in the message too, as part of the signed one
    assert unreachable(Rejection(f"Timeout while downloading {SIGNED}", None, "read_failed"), LINKED) == (A,)
    unsigned = SIGNED.split("?")[0]
    assert unreachable(Rejection(f"Error while downloading {unsigned}.", None, "not_found"), LINKED) == (C,)


def test_an_answer_that_names_nothing_is_put_down_to_every_url_image_each_once() -> None:
    assert unreachable(Rejection("Cannot fetch content from the provided URL.", None, "read_failed"), LINKED) == (A, B, C)
    assert unreachable(Rejection("Error while downloading https://elsewhere/x.png", None, "not_found"), LINKED) == (A, B, C)
    assert unreachable(Rejection("x", None, "not_found"), []) == ()


def test_the_quarantine_says_what_the_answer_said_of_the_url() -> None:
    gone = unfetched(Rejection("x", None, "not_found"), (A, B), {A: "cat.png"})
    assert gone == (Quarantine(A, "not_found", False, "cat.png", url=True, suspects=2),
                    Quarantine(B, "not_found", False, None, url=True, suspects=2))
    [slow] = unfetched(Rejection("x", None, "read_failed"), (A,), {})
    assert (slow.failure, slow.retryable, slow.url, slow.suspects) == ("read_failed", True, True, 1)
    with pytest.raises(ValueError):
        unfetched(Rejection("Could not process image"), (A,), {})


# --- what later requests get ------------------------------------------------------------------

def _state(*data: Quarantine | Rejected) -> SessionState:
    return fold(envelope(seq, "2026-01-01T00:00:00+00:00", item) for seq, item in enumerate(data, 1))


def test_a_quarantined_url_is_its_placeholder_on_every_upstream_and_others_go_as_they_came() -> None:
    state = _state(Quarantine(A, "not_found", False, "cat.png", url=True, suspects=1))
    refs = [ImageRef(A, url_name(SIGNED)), ImageRef(B, "dog.jpg")]
    expected = Placeholder("not_found", f'[image unavailable: not_found; "cat.png" ({A[:15]})]')
    for fmt in ("openai", "anthropic", "gemini"):
        assert held_urls(refs, state, fmt) == (expected, None)
    assert held_urls(refs, EMPTY, "openai") == (None, None)
    assert held_urls([], state, "openai") == ()


def test_a_url_refused_for_its_content_holds_only_for_that_format() -> None:
    state = _state(Rejected(B, "gemini", 1, "sha256:" + "0" * 64))
    ref = ImageRef(B, "dog.jpg")
    [held] = held_urls([ref], state, "gemini")
    assert held is not None and held.failure == "rejected"
    assert held_urls([ref], state, "openai") == (None,)


def test_a_url_quarantine_folds_checkpoints_and_encodes_as_a_whole_value() -> None:
    quarantine = Quarantine(A, "read_failed", True, "cat.png", url=True, suspects=3)
    event = envelope(1, "2026-01-01T00:00:00+00:00", quarantine)
    raw = encode_event(event)
    assert SIGNED not in raw.decode() and "5f1e0c6a9d" not in raw.decode()  # the log keeps no URL
    assert decode_event(raw) == event
    state = fold([event])
    assert state.quarantined[A] == quarantine
    assert fold([envelope(1, "t", checkpoint_of(state))]).quarantined[A] == quarantine
    # a store quarantine encodes as it always did: the new fields are left out at their defaults
    assert encode_event(envelope(1, "t", Quarantine(B, "not_found", False))) == (
        b'{"type":"attachment/quarantine","seq":1,"time":"t","data":{"attachment_id":"' + B.encode()
        + b'","failure":"not_found","retryable":false}}')


def test_an_older_replica_reads_a_url_quarantine_as_a_quarantine() -> None:
    class OldQuarantine(msgspec.Struct, frozen=True):  # the event as the version before this one knew it
        attachment_id: str
        failure: str
        retryable: bool
        name: str | None = None

    raw = msgspec.json.encode(Quarantine(A, "not_found", False, "cat.png", url=True, suspects=1))
    assert msgspec.json.decode(raw, type=OldQuarantine) == OldQuarantine(A, "not_found", False, "cat.png")


def test_no_probe_and_no_read_ever_reaches_a_url_image() -> None:
    then = datetime(2026, 1, 1, tzinfo=UTC)
    state = fold([envelope(1, then.isoformat(), Quarantine(A, "read_failed", True, url=True, suspects=1)),
                  envelope(2, then.isoformat(), Quarantine(B, "read_failed", True))])
    prober = Prober(60, now=lambda: then + timedelta(hours=1))
    assert prober.due(state, [A, B]) == frozenset({B})  # a store's retryable quarantine is probed; the URL's never
    # a reference that spells a URL's identity is its placeholder, never read from the store
    step = decide(Ask([ImageRef(A)], recording=True), Progress(state))
    assert isinstance(step, Done) and isinstance(step.outcomes[0], Placeholder)
