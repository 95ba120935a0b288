"""Red team of the URL images' attribution (policy layer, pure): a quarantine for one URL never
hides another that merely appears inside it."""

from __future__ import annotations

from projectionist.policy.linked import url_id
from projectionist.policy.profile import Rejection
from projectionist.policy.rejection import unreachable

ORIGINAL = "https://cdn.example/photos/cat.png"
#: an image proxy's URL (a resizer, a CDN's fetch-through) that carries the original as a parameter
RESIZED = "https://wsrv.nl/?url=https://cdn.example/photos/cat.png&w=200"


def test_a_quoted_url_inside_the_quoted_one_is_not_put_down_too() -> None:
    linked = [("/messages/0/content/1/image_url/url", url_id(ORIGINAL), ORIGINAL),
              ("/messages/0/content/2/image_url/url", url_id(RESIZED), RESIZED)]
    # only the resizer failed: the original (which the provider fetched fine) stays a URL
    assert unreachable(Rejection(f"Error while downloading {RESIZED}.", None, "not_found"), linked) == (url_id(RESIZED),)
    assert unreachable(Rejection(f"Error while downloading {ORIGINAL}.", None, "not_found"), linked) == (url_id(ORIGINAL),)
