"""docs/region-scale.png from bench/region_scale.json: each figure against N (stores), as an SVG
drawn here and rendered by the headless Chromium the UI tests use (no plotting dependency)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

CHROMIUM = Path(os.environ.get("STORE_ROLLOUT_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update"]
PANEL_W, PANEL_H, COLS = 330, 220, 3

# (title, unit, value of one run)
METRICS: list[tuple[str, str, Any]] = [
    ("salt-master CPU per store", "CPU s / store / hour",
     lambda r: r["master_cpu_seconds_per_store_per_hour"]),
    ("salt-master memory (RSS)", "MiB", lambda r: r["master_rss_mib"]),
    ("light minions' memory", "KiB / minion", lambda r: r["rss_per_minion_kib"]),
    ("reconcile's Salt reads", "s (acceptance: 60 at N=1000)",
     lambda r: r["reconcile_salt_reads"]["wall_s"]),
    ("all back after AES key rotation", "s", lambda r: r["storm"]["all_back_s"]),
    ("all back after a master restart", "s", lambda r: r["restart"]["all_back_s"]),
]


def panel(title: str, unit: str, points: list[tuple[float, float]], x0: int, y0: int) -> str:
    left, right, top, bottom = 68, 15, 30, 35
    w, h = PANEL_W - left - right, PANEL_H - top - bottom
    xmax = max(p[0] for p in points) or 1
    ymax = (max(p[1] for p in points) or 1) * 1.15
    sx = lambda x: x0 + left + w * x / xmax  # noqa: E731
    sy = lambda y: y0 + top + h - h * y / ymax  # noqa: E731
    out = [f'<text x="{x0 + PANEL_W / 2}" y="{y0 + 18}" text-anchor="middle" '
           f'font-weight="bold">{title}</text>',
           f'<line x1="{sx(0)}" y1="{sy(0)}" x2="{sx(xmax)}" y2="{sy(0)}" stroke="#000"/>',
           f'<line x1="{sx(0)}" y1="{sy(0)}" x2="{sx(0)}" y2="{sy(ymax)}" stroke="#000"/>',
           f'<text x="{x0 + 10}" y="{y0 + top + h / 2}" transform="rotate(-90 {x0 + 10} '
           f'{y0 + top + h / 2})" text-anchor="middle" font-size="10">{unit}</text>',
           f'<text x="{x0 + left + w / 2}" y="{y0 + PANEL_H - 4}" text-anchor="middle" '
           f'font-size="10">stores (N)</text>']
    for i in range(5):
        y = ymax * i / 4
        out.append(f'<text x="{sx(0) - 4}" y="{sy(y) + 3}" text-anchor="end" '
                   f'font-size="9">{y:.3g}</text>')
    path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
    out.append(f'<polyline points="{path}" fill="none" stroke="#1f6fb4" stroke-width="2"/>')
    for x, y in points:
        out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5" fill="#1f6fb4"/>',
                f'<text x="{sx(x):.1f}" y="{sy(0) + 12}" text-anchor="middle" '
                f'font-size="9">{x:g}</text>',
                f'<text x="{sx(x) - 4:.1f}" y="{sy(y) - 6:.1f}" text-anchor="end" '
                f'font-size="9">{y:.3g}</text>']
    return "\n".join(out)


def svg(result: dict[str, Any]) -> str:
    runs = sorted(result["runs"], key=lambda r: r["stores"])
    rows = (len(METRICS) + COLS - 1) // COLS
    width, height = COLS * PANEL_W, rows * PANEL_H
    parts = [panel(title, unit, [(r["stores"], float(value(r))) for r in runs],
                   (i % COLS) * PANEL_W, (i // COLS) * PANEL_H)
             for i, (title, unit, value) in enumerate(METRICS)]
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'font-family="sans-serif" font-size="11"><rect width="100%" height="100%" '
            f'fill="#fff"/>{"".join(parts)}</svg>')


def plot(result: dict[str, Any], png: Path) -> None:
    from playwright.sync_api import sync_playwright

    drawing = svg(result)
    rows = (len(METRICS) + COLS - 1) // COLS
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": COLS * PANEL_W, "height": rows * PANEL_H})
            page.set_content(f"<html><body style='margin:0'>{drawing}</body></html>")
            page.screenshot(path=str(png), full_page=True)
        finally:
            browser.close()
