"""HTML of the dashboard's pages: pure functions from data to escaped HTML (no I/O here)."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Sequence
from typing import Any

from .http import esc

__all__ = ["page", "table", "login_page", "waterfall_html", "fmt_time", "fmt_s"]

NAV = [("/", "cluster"), ("/nodes", "nodes"), ("/tasks", "tasks"), ("/checkpoints", "checkpoints"),
       ("/incidents", "incidents"), ("/traces", "traces")]

CSS = """
body{font-family:system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d232b}
header{background:#1d232b;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}
header a{color:#cfe3ff;text-decoration:none}header .who{margin-left:auto;color:#aab}
main{padding:16px}table{border-collapse:collapse;background:#fff;width:100%}
th,td{border-bottom:1px solid #e3e6ea;padding:4px 8px;text-align:left;font-size:14px;vertical-align:top}
th{background:#eef1f4}.ok{color:#17803d}.bad{color:#b42318}.dim{color:#778}
pre{background:#10151b;color:#d8e1ea;padding:8px;overflow:auto;max-height:480px}
.wf{position:relative;height:16px;background:#f0f2f5;min-width:300px}
.wf .bar{position:absolute;top:2px;height:12px;border-radius:2px;min-width:2px}
"""

_COLORS = ("#3b82f6", "#a855f7", "#10b981", "#f59e0b", "#ef4444", "#06b6d4", "#84cc16", "#ec4899")


def fmt_time(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts > 0 else ""


def fmt_s(s: float) -> str:
    return f"{s:.2f} s" if s >= 1 else f"{s * 1e3:.1f} ms"


def page(title: str, body: str, *, user: str = "") -> bytes:
    nav = "".join(f'<a href="{href}">{esc(name)}</a>' for href, name in NAV)
    who = (f'<span class="who">{esc(user)} · <form method="post" action="/logout" style="display:inline">'
           f'<button>log out</button></form></span>') if user else ""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)} · Fire-Flyer</title>"
            f"<style>{CSS}</style></head><body><header><b>Fire-Flyer</b>{nav}{who}</header>"
            f"<main><h2>{esc(title)}</h2>{body}</main></body></html>").encode()


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, row_class: str = "", raw: bool = False) -> str:
    """A table; cells are escaped unless ``raw`` (then the caller built them from escaped parts)."""
    cell = (lambda v: str(v)) if raw else esc
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join(f'<tr class="{esc(row_class)}">' + "".join(f"<td>{cell(v)}</td>" for v in r) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def login_page(error: str = "") -> bytes:
    err = f'<p class="bad">{esc(error)}</p>' if error else ""
    body = (f"{err}<form method='post' action='/login'><label>token "
            "<input type='password' name='token' id='token' size='50' autocomplete='off'></label> "
            "<button type='submit' id='login'>log in</button></form>"
            "<p class='dim'>A bearer token of the cluster (ff up writes them to &lt;state&gt;/tokens.json).</p>")
    return page("log in", body)


def waterfall_html(rows: Sequence[Any]) -> str:
    """One table row per span: name indented by depth, service, a bar on the trace's time axis."""
    total = max((r.offset_s + r.duration_s for r in rows), default=0.0) or 1e-9
    services = sorted({r.span.service for r in rows})
    color = {s: _COLORS[i % len(_COLORS)] for i, s in enumerate(services)}
    out = []
    for r in rows:
        left = 100.0 * r.offset_s / total
        width = max(0.2, 100.0 * r.duration_s / total)
        name = esc(r.span.name) + (" <span class='dim'>(parent missing)</span>" if r.orphan else "")
        cls = "bad" if r.span.status == "ERROR" else ""
        out.append(
            f"<tr class='span {cls}' data-span-id='{esc(r.span.span_id)}' data-parent='{esc(r.span.parent_span_id or '')}'>"
            f"<td style='padding-left:{8 + 16 * r.depth}px'>{name}</td><td>{esc(r.span.service)}</td>"
            f"<td class='dim'>{esc(r.span.instance)}</td>"
            f"<td><div class='wf'><div class='bar' style='left:{left:.3f}%;width:{min(width, 100 - left):.3f}%;"
            f"background:{color[r.span.service]}' title='{esc(fmt_s(r.offset_s))} + {esc(fmt_s(r.duration_s))}'>"
            f"</div></div></td><td>{esc(fmt_s(r.duration_s))}</td></tr>")
    head = "<tr><th>span</th><th>service</th><th>instance</th><th>0 … " + esc(fmt_s(total)) + "</th><th>duration</th></tr>"
    return f"<table id='waterfall'><thead>{head}</thead><tbody>{''.join(out)}</tbody></table>"
