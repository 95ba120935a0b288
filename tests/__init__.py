"""The test suite: a package, so that ``from tests.fakes import ...`` works from every folder.

Support modules that hold tests or test assertions (outside ``test_*.py``) get pytest's assertion
rewriting too; they must be registered before anything imports them, hence here.
"""

import pytest

pytest.register_assert_rewrite("tests.policy_table", "tests.golden_chat", "tests.golden_gemini",
                               "tests.golden_responses", "tests.calls", "tests.commands")
