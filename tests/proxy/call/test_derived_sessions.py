"""The derived session (``proxy.call.sessions.derived``) of a conversation whose client rewrites
its reminder parts between turns (Qwen Code drops its date reminder on turn 2), and what still
starts a new one."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from multidict import CIMultiDict

from projectionist.adapters import anthropic_messages, gemini, openai_chat, openai_responses
from projectionist.adapters.base import bookkeeping
from projectionist.proxy.call.sessions import derived

REMINDERS = ["<system-reminder>\nThe following tools are reachable: read_file\n</system-reminder>",
             "<system-reminder>\nThe current date is: Sunday, December 6, 2026.\n</system-reminder>"]


def chat(reminders: list[str], prompt: str = "Describe the screenshot @shot.png", *, turns: int = 1,
         system: str = "You are Qwen Code") -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": r} for r in reminders]
    parts += [{"type": "text", "text": prompt}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": parts}]
    for n in range(1, turns):
        messages += [{"role": "assistant", "content": f"answer {n}"}, {"role": "user", "content": f"question {n}"}]
    return {"model": "gpt-4o", "messages": messages}


KEY = CIMultiDict({"Authorization": "Bearer sk-one"})


def session(body: dict[str, Any], headers: CIMultiDict[str] = KEY, fmt: Any = openai_chat) -> str:
    found = derived(fmt, headers, body, {})
    assert found is not None and found.source == "derived"
    return found.id


def test_a_dropped_or_changed_reminder_keeps_the_session() -> None:
    first = session(chat(REMINDERS))
    assert session(chat(REMINDERS[:1], turns=2)) == first  # Qwen Code's second turn: the date dropped
    assert session(chat([REMINDERS[0], REMINDERS[1].replace("Sunday, December 6", "Monday, December 7")],
                        turns=3)) == first
    assert session(chat([], turns=2)) == first


def test_what_starts_a_new_session() -> None:
    first = session(chat(REMINDERS))
    assert session(chat(REMINDERS, prompt="Describe the other screenshot")) != first  # the user's words
    assert session(chat(REMINDERS, system="You are a memory extraction subagent")) != first  # a side call
    assert session(chat(REMINDERS), CIMultiDict({"Authorization": "Bearer sk-two"})) != first  # another key
    # a part that merely mentions a reminder, or holds more than one block and text, is the conversation's
    body = chat(REMINDERS)
    body["messages"][1]["content"][0]["text"] += " and then some words of the user"
    assert session(body) != first
    body = chat(REMINDERS)
    body["messages"][1]["content"][0]["extra"] = "kept"
    assert session(body) != first
    # the user's words between two reminder blocks are the conversation's too
    wrapped = "<system-reminder>a</system-reminder> {} <system-reminder>b</system-reminder>"
    alice, bob = chat([wrapped.format("Alice: delete prod")]), chat([wrapped.format("Bob: what is this?")])
    assert session(alice) != session(bob)


def test_a_key_in_the_query_scopes_the_session_too() -> None:
    """Gemini's ``?key=``: two keys, two sessions, however alike their conversations open."""
    from multidict import MultiDict

    body, none = chat(REMINDERS), CIMultiDict[str]()
    one = derived(openai_chat, none, body, {}, MultiDict({"key": "KEY-ALICE"}))
    two = derived(openai_chat, none, body, {}, MultiDict({"key": "KEY-BOB"}))
    assert one is not None and two is not None and one.id != two.id


def test_the_same_rule_in_the_other_formats() -> None:
    messages = {"model": "claude", "max_tokens": 10, "messages": [{"role": "user", "content": [
        {"type": "text", "text": r} for r in REMINDERS] + [{"type": "text", "text": "look"}]}]}
    dropped = copy.deepcopy(messages)
    del dropped["messages"][0]["content"][1]
    assert session(messages, fmt=anthropic_messages) == session(dropped, fmt=anthropic_messages)
    contents = {"contents": [{"role": "user", "parts": [{"text": r} for r in REMINDERS] + [{"text": "look"}]}]}
    dropped = copy.deepcopy(contents)
    del dropped["contents"][0]["parts"][1]
    assert session(contents, fmt=gemini) == session(dropped, fmt=gemini)
    assert session(contents, fmt=gemini) != session(messages, fmt=anthropic_messages)


def gemini_cli(day: str, prompt: str = "Describe the screenshot @shot.png", *, turns: int = 1,
               memory: str = "", merged: bool = True) -> dict[str, Any]:
    """A body as Gemini CLI 0.61 sends it (seen through the proxy): its ``<session_context>``
    part (today's date, the folder tree, its memory) first in the first user content, then the
    user's prompt with the image; its model router's call (``merged=False``) sends the context as
    a content of its own."""
    context = {"text": f"<session_context>\nThis is the Gemini CLI. We are setting up the context for our chat.\n"
                       f"Today's date is {day} (formatted according to the user's locale).\n{memory}\n</session_context>"}
    prompted = [{"text": prompt}, {"inlineData": {"mimeType": "image/png", "data": "AAAA"}}]
    contents: list[dict[str, Any]] = ([{"role": "user", "parts": [context, *prompted]}] if merged else
                                      [{"role": "user", "parts": [context]}, {"role": "user", "parts": prompted}])
    for n in range(1, turns):
        contents += [{"role": "model", "parts": [{"text": f"answer {n}"}]},
                     {"role": "user", "parts": [{"text": f"question {n}"}]}]
    return {"systemInstruction": {"parts": [{"text": "You are Gemini CLI"}]}, "contents": contents}


def test_gemini_clis_session_context_is_bookkeeping_and_the_opening_runs_past_it() -> None:
    """Resumed the next day (``--resume``: a new date, a changed memory), the conversation keeps
    its session; and two conversations whose first content is the same ``<session_context>``
    alone still differ by the user's first prompt, as before the context part was left out."""
    for merged in (True, False):
        first = session(gemini_cli("Sunday, December 6, 2026", merged=merged), fmt=gemini)
        resumed = gemini_cli("Monday, December 7, 2026", turns=3, memory="- the user prefers tabs", merged=merged)
        assert session(resumed, fmt=gemini) == first
        other = gemini_cli("Sunday, December 6, 2026", "Describe the other screenshot", merged=merged)
        assert session(other, fmt=gemini) != first


def test_a_message_of_bookkeeping_alone_never_makes_the_opening() -> None:
    """Without its own message the opening would be the system prompt alone, shared by every
    conversation of the client: a Chat message of reminders alone (string or parts) is skipped."""
    for reminder in (REMINDERS[1], [{"type": "text", "text": REMINDERS[1]}]):
        alice, bob = chat([], "Alice asks"), chat([], "Bob asks")
        for body in (alice, bob):
            body["messages"].insert(1, {"role": "user", "content": reminder})
        assert session(alice) != session(bob)
        assert session(alice) == session(chat([], "Alice asks"))


@pytest.mark.parametrize(("node", "kept"), [
    ("<system-reminder>date</system-reminder>", True),  # a string: a system prompt, an input
    ({"text": "  <session_context>\ndate\n</session_context>\n"}, False),
    ({"type": "text", "text": "<system-reminder>a</system-reminder>", "cache_control": {"type": "ephemeral"}}, False),
    ({"type": "text", "text": "<session_context>a</session_context> and the user's words"}, True),
    ({"type": "text", "text": "<system-reminder>a</system-reminder><system-reminder>b</system-reminder>"}, True),
    ({"type": "text", "text": "<session_context>a</system-reminder>"}, True),
    ({"type": "image_url", "image_url": {"url": "data:,"}}, True),
    ({"text": "<hook_context>a</hook_context>"}, True),
    (7, True),
])
def test_what_is_bookkeeping(node: Any, kept: bool) -> None:
    assert bookkeeping(node) is not kept


def test_what_bookkeeping_never_covers() -> None:
    """A stranger's edge cases (the red team's): a system prompt or an input given as one block,
    a message of bookkeeping with an author or tool calls, are the conversation's; two of them
    that differ never share a session."""
    def block(who: str) -> str:
        return f"<system-reminder>{who} bot</system-reminder>"

    for who_body in (
        lambda who: ({"system": block(who), "messages": [{"role": "user", "content": "hi"}]}, anthropic_messages),
        lambda who: ({"messages": [{"role": "system", "content": block(who)}, {"role": "user", "content": "hi"}]},
                     openai_chat),
        lambda who: ({"instructions": block(who), "input": "hi"}, openai_responses),
        lambda who: ({"instructions": "be brief", "input": block(who)}, openai_responses),
        lambda who: ({"messages": [{"role": "user", "content": REMINDERS[0], "name": who},
                                   {"role": "user", "content": "hi"}]}, openai_chat),
        lambda who: ({"messages": [{"role": "assistant", "content": REMINDERS[0],
                                    "tool_calls": [{"id": who, "type": "function",
                                                    "function": {"name": who, "arguments": "{}"}}]},
                                   {"role": "user", "content": "hi"}]}, openai_chat),
    ):
        (alice, fmt), (bob, _) = who_body("alice"), who_body("bob")
        assert session(alice, fmt=fmt) != session(bob, fmt=fmt), alice


def test_a_blank_gemini_role_is_the_users_and_openings_keep_their_old_value() -> None:
    """Gemini: a role left blank or null is the user's, as a missing one; and a body that does
    not open with a message of bookkeeping alone is named by the same opening as before the
    bookkeeping rule (an upgrade splits no conversation), whatever its first message's role."""
    image = {"inlineData": {"mimeType": "image/png", "data": "AAAA"}}
    for role in ("", None):
        body = {"contents": [{"role": role, "parts": [{"text": "describe"}, image]}]}
        assert gemini.opening(body) == [None, body["contents"][0]]
        assert derived(gemini, KEY, body, {}) is not None
    greeting = {"system": "s", "messages": [{"role": "assistant", "content": "Hello"}, {"role": "user", "content": "q"}]}
    assert anthropic_messages.opening(greeting) == ["s", greeting["messages"][0]]
    model_first = {"contents": [{"role": "model", "parts": [{"text": "Hello"}]}, {"role": "user", "parts": [image]}]}
    assert gemini.opening(model_first) == [None, model_first["contents"][0]]
