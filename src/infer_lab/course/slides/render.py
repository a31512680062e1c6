"""The deck as one self-contained HTML file: figures inlined as base64 PNG, no network, a small script.

Navigation: → / Space / PageDown next, ← / PageUp back, Home / End, a slide number in the
address (``deck.html#12``), ``n`` speaker notes under the slide, ``s`` a speaker view in a
second window (current notes, next slide, elapsed time against the agenda), ``o`` an overview
of every section and slide, ``f`` full screen. Printing gives one slide per page.
"""

from __future__ import annotations

import html
from pathlib import Path

import markdown

from .deck import Deck, Image, Section, Slide, Table


def md(text: str) -> str:
    """Markdown (tables included) to HTML."""
    return markdown.markdown(text, extensions=["tables", "sane_lists"]) if text.strip() else ""


def esc(text: str) -> str:
    return html.escape(str(text), quote=True)


def image_html(img: Image) -> str:
    return (f'<figure><img src="data:image/png;base64,{img.png_base64}" alt="{esc(img.title)}">'
            f'<figcaption class="provenance">{esc(img.caption)}</figcaption></figure>')


def table_html(tab: Table) -> str:
    numeric = [all(_is_number(r[i]) for r in tab.rows) and bool(tab.rows) for i in range(len(tab.columns))]
    head = "".join(f'<th class="{"num" if n else ""}">{esc(c)}</th>' for c, n in zip(tab.columns, numeric, strict=True))
    body = "".join("<tr>" + "".join(f'<td class="{"num" if n else ""}">{esc(v)}</td>'
                                    for v, n in zip(row, numeric, strict=True)) + "</tr>" for row in tab.rows)
    more = (f'<p class="more">… {tab.more_rows:,} more row{"" if tab.more_rows == 1 else "s"} in the notebook</p>'
            if tab.more_rows else "")
    caption = f'<p class="provenance">{esc(tab.caption)}</p>' if tab.caption else ""
    return (f'<div class="table"><p class="table-title">{esc(tab.title)}</p><table><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>{more}{caption}</div>")


def _is_number(text: str) -> bool:
    t = text.replace(",", "").replace("×", "").replace("%", "").replace("—", "").strip()
    try:
        float(t)
    except ValueError:
        return text.strip().startswith("—")
    return True


def slide_html(index: int, section: Section, slide: Slide) -> str:
    badge = ' <span class="role-badge">backup</span>' if slide.role == "backup" else ""
    parts = [f'<header class="section-bar">{esc(section.times)} · {esc(section.title)}{badge}</header>',
             f"<h1>{esc(slide.title)}</h1>"]
    if slide.warning:
        warning = md(slide.warning).removeprefix("<p>").removesuffix("</p>")
        parts.append(f'<div class="warning"><strong>Caution:</strong> {warning}</div>')
    text = md(slide.body) if slide.body else ""
    media = "".join(image_html(i) for i in slide.images)
    tables = "".join(table_html(t) for t in slide.tables)
    if text and media:  # words beside the figure, so neither is cut off on a 16:9 screen
        parts.append(f'<div class="content split"><div class="words">{text}{tables}</div>'
                     f'<div class="media">{media}</div></div>')
    else:
        parts.append(f'<div class="content">{text}{media}{tables}</div>')
    parts.append(f'<aside class="notes"><p class="notes-title">Speaker notes</p>{md(slide.notes)}</aside>')
    return (f'<section class="slide kind-{esc(slide.kind)} role-{esc(slide.role)}" id="slide-{index}" '
            f'data-index="{index}" data-role="{esc(slide.role)}" '
            f'data-section="{esc(section.key)}" data-start="{section.start}" data-end="{section.end}" '
            f'data-title="{esc(slide.title)}">{"".join(parts)}</section>')


def overview_html(deck: Deck) -> str:
    items, index = [], 0
    for section in deck.sections:
        links = []
        for slide in section.slides:
            index += 1
            tag = ' <span class="role-badge">backup</span>' if slide.role == "backup" else ""
            links.append(f'<li class="role-{esc(slide.role)}"><a href="#{index}" data-go="{index}">'
                         f'{esc(slide.title)}</a>{tag}</li>')
        items.append(f'<li class="ov-section"><span class="ov-time">{esc(section.times)}</span> '
                     f'<strong>{esc(section.title)}</strong><ol start="{index - len(section.slides) + 1}">'
                     f'{"".join(links)}</ol></li>')
    return f'<nav id="overview" hidden><h2>Overview</h2><ul>{"".join(items)}</ul></nav>'


def render(deck: Deck) -> str:
    """The whole deck as one HTML document."""
    slides = "".join(slide_html(i + 1, s, slide) for i, (s, slide) in enumerate(deck.slides))
    title = f"{deck.title} · built {deck.built}"
    return (
        "<!doctype html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="generator" content="infer-lab slides ({esc(deck.mode)}, {esc(deck.hardware)})">'
        f"<style>{CSS}</style></head><body>"
        f'<main id="deck">{slides}</main>{overview_html(deck)}'
        '<footer id="bar"><span id="where"></span><span id="count"></span><div id="progress"></div></footer>'
        f"<script>{SCRIPT}</script></body></html>\n"
    )


def write(deck: Deck, out_dir: Path) -> Path:
    """Write ``out_dir/index.html`` and return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "index.html"
    path.write_text(render(deck), encoding="utf-8")
    return path


CSS = """
*{box-sizing:border-box}
html,body{margin:0;height:100%;background:#fafaf7;color:#1d1d1f;font-family:system-ui,-apple-system,"Segoe UI",
Roboto,"Helvetica Neue",Arial,sans-serif}
#deck{position:fixed;inset:0 0 2.2rem 0}
.slide{position:absolute;inset:0;padding:2.2vh 4vw 1vh;overflow:auto;display:none;flex-direction:column}
.slide.active{display:flex}
.section-bar{font-size:.85rem;color:#6b6b70;letter-spacing:.02em;border-bottom:1px solid #e2e2dc;padding-bottom:.3rem}
h1{font-size:clamp(1.3rem,2.6vw,2.3rem);margin:.6rem 0 .8rem;line-height:1.15}
.kind-title h1{font-size:clamp(2rem,4vw,3.4rem);margin-top:18vh}
.kind-section h1{font-size:clamp(1.8rem,3.4vw,3rem);margin-top:8vh;color:#7a2e12}
.content{font-size:clamp(.95rem,1.45vw,1.35rem);line-height:1.45;flex:1}
.content p{margin:.35rem 0 .7rem}
figure{margin:.4rem 0;text-align:center}
figure img{max-width:100%;max-height:calc(100vh - 13rem);object-fit:contain}
.split{display:grid;grid-template-columns:minmax(0,2fr) minmax(0,3fr);gap:2.5vw;align-items:start}
.split .words{font-size:.92em}
body.show-notes figure img{max-height:calc(70vh - 13rem)}
.provenance{font-size:.8rem;color:#55555a;font-style:italic;margin:.2rem 0}
.table{margin:.4rem 0 1rem;overflow-x:auto}
.table-title{font-weight:600;font-size:.9em;margin:.2rem 0}
table{border-collapse:collapse;font-size:.78em}
th,td{padding:.2rem .7rem;border-bottom:1px solid #e4e4de;text-align:left;vertical-align:top}
th{background:#f0efe9}
.num{text-align:right;font-variant-numeric:tabular-nums}
.more{font-size:.8rem;color:#6b6b70}
.role-badge{font-size:.7rem;text-transform:uppercase;letter-spacing:.08em;background:#e4e4de;color:#55555a;
padding:0 .4rem;border-radius:3px;margin-left:.5rem}
#overview li.role-backup a{color:#8a8a90}
.warning{background:#fff4d6;border-left:5px solid #d49a00;padding:.5rem .8rem;margin:.3rem 0 .6rem;font-size:.95rem}
code{background:#efeee8;padding:0 .25rem;border-radius:3px}
.notes{display:none}
body.show-notes #deck{bottom:30vh}
body.show-notes .slide.active .notes{display:block;position:fixed;left:0;right:0;bottom:2.2rem;height:calc(30vh - 2.2rem);
overflow:auto;background:#20232a;color:#f2f2f2;padding:.6rem 4vw;font-size:1rem}
.notes-title{font-weight:700;text-transform:uppercase;font-size:.75rem;letter-spacing:.08em;color:#9aa}
.notes a{color:#9cf}
#bar{position:fixed;left:0;right:0;bottom:0;height:2.2rem;display:flex;justify-content:space-between;align-items:center;
padding:0 1rem;font-size:.8rem;color:#6b6b70;background:#f0efe9;border-top:1px solid #e2e2dc}
#progress{position:absolute;left:0;top:0;height:3px;background:#c2410c;width:0}
#overview{position:fixed;inset:0;overflow:auto;background:rgba(250,250,247,.98);padding:2rem 4vw;z-index:10}
#overview ul{list-style:none;padding:0}
#overview ol{columns:2;font-size:.85rem}
.ov-section{margin-bottom:1rem}
.ov-time{color:#7a2e12;font-variant-numeric:tabular-nums}
@media print{#bar,#overview{display:none}#deck{position:static}
.slide{display:flex!important;position:relative;height:auto;min-height:100vh;page-break-after:always}.notes{display:none!important}}
"""

SCRIPT = r"""
(function () {
  const slides = Array.from(document.querySelectorAll('.slide'));
  const overview = document.getElementById('overview');
  const started = Date.now();
  let current = 0;
  let speaker = null;

  function clock(min) { const m = Math.max(0, Math.floor(min)); return Math.floor(m / 60) + ':' + String(m % 60).padStart(2, '0'); }

  function show(n) {
    current = Math.max(0, Math.min(slides.length - 1, n));
    slides.forEach((s, k) => s.classList.toggle('active', k === current));
    const s = slides[current];
    if (location.hash !== '#' + (current + 1)) history.replaceState(null, '', '#' + (current + 1));
    document.getElementById('count').textContent = (current + 1) + ' / ' + slides.length;
    document.getElementById('where').textContent = s.querySelector('.section-bar').textContent;
    document.getElementById('progress').style.width = (100 * (current + 1) / slides.length) + '%';
    updateSpeaker();
  }

  function speakerHTML() {
    const s = slides[current], next = slides[current + 1];
    const elapsed = (Date.now() - started) / 60000;
    return '<p class="meta">Slide ' + (current + 1) + ' / ' + slides.length + ' · elapsed ' + clock(elapsed) +
      ' · this section is planned for ' + clock(+s.dataset.start) + '–' + clock(+s.dataset.end) + '</p>' +
      '<h1>' + s.querySelector('h1').innerHTML + '</h1>' + s.querySelector('.notes').innerHTML +
      '<p class="next">Next: ' + (next ? next.querySelector('h1').innerHTML : '(end)') + '</p>';
  }

  function updateSpeaker() {
    if (!speaker || speaker.closed) return;
    const box = speaker.document.getElementById('speaker');
    if (box) box.innerHTML = speakerHTML();
  }

  function openSpeaker() {
    speaker = window.open('', 'infer-lab-speaker', 'width=960,height=720');
    if (!speaker) return;
    speaker.document.open();
    speaker.document.write('<!doctype html><title>Speaker view</title><style>body{font-family:system-ui,sans-serif;' +
      'background:#20232a;color:#f2f2f2;padding:1.5rem;font-size:1.15rem;line-height:1.45}.meta,.next{color:#9aa}' +
      '.notes-title{display:none}a{color:#9cf}</style><div id="speaker"></div>');
    speaker.document.close();
    speaker.document.addEventListener('keydown', (e) => key(e));
    updateSpeaker();
    setInterval(updateSpeaker, 15000);
  }

  function key(e) {
    if (e.metaKey || e.ctrlKey || e.altKey) return;
    const k = e.key;
    if (['ArrowRight', 'PageDown', ' ', 'j'].includes(k)) { show(current + 1); e.preventDefault(); }
    else if (['ArrowLeft', 'PageUp', 'k', 'Backspace'].includes(k)) { show(current - 1); e.preventDefault(); }
    else if (k === 'Home') show(0);
    else if (k === 'End') show(slides.length - 1);
    else if (k === 'n') document.body.classList.toggle('show-notes');
    else if (k === 's') openSpeaker();
    else if (k === 'o') overview.hidden = !overview.hidden;
    else if (k === 'Escape') overview.hidden = true;
    else if (k === 'f') { if (document.fullscreenElement) document.exitFullscreen(); else document.documentElement.requestFullscreen(); }
  }

  document.addEventListener('keydown', key);
  overview.addEventListener('click', (e) => {
    const a = e.target.closest('[data-go]');
    if (a) { e.preventDefault(); overview.hidden = true; show(+a.dataset.go - 1); }
  });
  window.addEventListener('hashchange', () => show((parseInt(location.hash.slice(1), 10) || 1) - 1));
  window.deck = { show: show, next: () => show(current + 1), prev: () => show(current - 1),
                  index: () => current, count: slides.length, openSpeaker: openSpeaker };
  show((parseInt(location.hash.slice(1), 10) || 1) - 1);
})();
"""
