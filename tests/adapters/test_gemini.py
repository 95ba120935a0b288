"""The Gemini adapter alone (pure): the golden request rendered to the exact projected body, Google's
error shape, and how placeholders replace image parts. The same golden request through the proxy,
and the official ``google-genai`` SDK against it: ``tests/proxy/call/test_gemini.py``."""

from __future__ import annotations

import msgspec

from projectionist.adapters import gemini
from projectionist.policy.errors import NOT_FOUND, READ_FAILED
from projectionist.policy.events import Quarantine
from projectionist.policy.fold import placeholder
from projectionist.policy.model import ImageRef, Outcome, Resolved, StoredImage, Placeholder
from projectionist.adapters.base import refs
from tests.golden_gemini import BLUE, BLUE_ID, GONE2_ID, GONE_ID, RED, RED_ID, golden
from tests.paths import GOLDEN


# --- golden -----------------------------------------------------------------------------------

def test_golden_adapter_renders_the_exact_projected_body() -> None:
    body = msgspec.json.decode((GOLDEN / "gemini.request.json").read_bytes())
    sites = refs(gemini.find_slots(body))
    assert [(s.ref.id, s.ref.name, s.host is not None) for s in sites] == [
        (RED_ID, "before.png", False), (BLUE_ID, None, False), (GONE_ID, "gone.png", False),
        (RED_ID, None, True), (GONE2_ID, "crop.png", True),
        (BLUE_ID, None, False), (GONE_ID, None, False)]
    images = {RED_ID: StoredImage(RED_ID, "image/png", len(RED), 1, 1, RED),
              BLUE_ID: StoredImage(BLUE_ID, "image/png", len(BLUE), 1, 1, BLUE)}
    # What the policy records for the two missing ids (the first occurrence's name is kept).
    quarantined = {GONE_ID: Quarantine(GONE_ID, "not_found", False, "gone.png"),
                   GONE2_ID: Quarantine(GONE2_ID, "not_found", False, "crop.png")}

    def outcome(ref: ImageRef) -> Outcome:
        if ref.id in images:
            return Resolved(images[ref.id])
        return Placeholder("not_found", placeholder(ref, quarantined[ref.id]))

    gemini.render(sites, tuple(outcome(s.ref) for s in sites))
    assert msgspec.json.encode(body) == golden("gemini.projected.json")


def test_adapter_error_body_is_googles_shape() -> None:
    body = gemini.error_body(NOT_FOUND, "gone", 422)
    assert body == {"error": {"code": 422, "message": "gone", "status": "FAILED_PRECONDITION", "details": [
        {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": NOT_FOUND, "domain": "projectionist"}]}}
    assert gemini.error_body(READ_FAILED, "x", 503)["error"]["status"] == "UNAVAILABLE"
    assert gemini.sign("POST", "https://x/v1beta/models/m:generateContent", {}, b"{}", "k") == {"x-goog-api-key": "k"}


# --- placeholders in place of image parts -------------------------------------------------------

def test_function_response_left_without_images_loses_its_empty_parts_list() -> None:
    from projectionist.adapters import gemini as adapter
    from projectionist.policy.model import ImageRef, Placeholder as Missing

    body = {"contents": [{"role": "user", "parts": [
        {"functionResponse": {"name": "shot", "response": {"ok": True},
                              "parts": [{"fileData": {"fileUri": f"attachment:{GONE_ID}", "mimeType": "image/png"}}]}},
        {"text": "after"}]}]}
    sites = refs(adapter.find_slots(body))
    assert [s.ref for s in sites] == [ImageRef(GONE_ID)]
    adapter.render(sites, (Missing("not_found", "[gone]"),))
    assert body["contents"][0]["parts"] == [
        {"functionResponse": {"name": "shot", "response": {"ok": True}}}, {"text": "[gone]"}, {"text": "after"}]


def test_placeholder_part_keeps_its_non_data_fields() -> None:
    from projectionist.adapters import gemini as adapter
    from projectionist.policy.model import Placeholder as Missing

    body = {"contents": [{"parts": [{"thoughtSignature": "sig", "fileData": {"fileUri": f"attachment:{GONE_ID}"}}]}]}
    sites = refs(adapter.find_slots(body))
    adapter.render(sites, (Missing("not_found", "[gone]"),))
    assert body["contents"][0]["parts"] == [{"thoughtSignature": "sig", "text": "[gone]"}]
