"""Test helper: a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``, which
``.ci/run`` installs) driven by Selenium, with async wrappers.

The proxy under test runs on the test's own event loop, so every WebDriver call (a blocking HTTP
round trip to chromedriver, which waits for the page, which waits for the proxy) runs on a
worker thread while the loop keeps serving.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
T = TypeVar("T")


@contextmanager
def chromium(width: int = 1280, height: int = 900) -> Iterator[webdriver.Chrome]:
    """A headless Chromium with a fresh profile (no cookies), stopped on exit."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--disable-extensions", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


class Browser:
    """Async steps over one WebDriver (each runs on a worker thread)."""

    def __init__(self, driver: webdriver.Chrome, base_url: str) -> None:
        self.driver = driver
        self.base_url = base_url.rstrip("/")

    async def run(self, step: Callable[[], T]) -> T:
        return await asyncio.to_thread(step)

    async def open(self, path: str) -> None:
        await self.run(lambda: self.driver.get(self.base_url + path))

    async def find(self, css: str) -> WebElement:
        return await self.run(lambda: self.driver.find_element(By.CSS_SELECTOR, css))

    async def all(self, css: str) -> list[WebElement]:
        return await self.run(lambda: self.driver.find_elements(By.CSS_SELECTOR, css))

    async def text(self, css: str) -> str:
        return await self.run(lambda: self.driver.find_element(By.CSS_SELECTOR, css).text)

    async def click(self, css: str) -> None:
        await self.run(lambda: self.driver.find_element(By.CSS_SELECTOR, css).click())

    async def type(self, css: str, text: str) -> None:
        await self.run(lambda: self.driver.find_element(By.CSS_SELECTOR, css).send_keys(text))

    async def until(self, condition: Callable[[webdriver.Chrome], Any], timeout: float = 10) -> Any:
        return await self.run(lambda: WebDriverWait(self.driver, timeout).until(condition))

    async def until_text(self, css: str, text: str, timeout: float = 10) -> str:
        """Wait until the element's text contains ``text``; its text."""
        def seen(driver: webdriver.Chrome) -> str | bool:
            found = driver.find_elements(By.CSS_SELECTOR, css)
            return found[0].text if found and text in found[0].text else False
        result: str = await self.until(seen, timeout)
        return result

    async def path(self) -> str:
        url: str = await self.run(lambda: self.driver.current_url)
        return url.removeprefix(self.base_url)

    async def sign_in(self, token: str, next_path: str = "/admin/ui") -> None:
        await self.open(f"/admin/ui/login?next={next_path}")
        await self.type("#token", token)
        await self.click("#sign-in")
        await self.until(lambda d: "/login" not in d.current_url)

    async def screenshot(self, path: Path) -> None:
        """The whole page (the window grown to the document's height), as a PNG."""
        def shoot() -> None:
            height = self.driver.execute_script("return document.documentElement.scrollHeight")
            width = self.driver.get_window_size()["width"]
            self.driver.set_window_size(width, min(max(int(height) + 120, 600), 4000))
            self.driver.save_screenshot(str(path))
        await self.run(shoot)

    def logs(self) -> list[dict[str, Any]]:
        """The browser console's messages (CSP violations and script errors show here)."""
        found: list[dict[str, Any]] = self.driver.get_log("browser")  # type: ignore[no-untyped-call]
        return found
