"""Renders captured terminal output as a PNG, as a terminal shows it: the last state of each
line that carriage returns and cursor-up sequences redrew (a progress bar's final frame), ANSI
sequences removed. Usage: render.py TYPESCRIPT OUT.png [LAST_N_LINES]. Needs Pillow (in the
PyTorch venv) and DejaVu Sans Mono."""
import re
import sys

from PIL import Image, ImageDraw, ImageFont


def screen(raw: str) -> list[str]:
    """The visible lines after replaying \r, \n, ESC[nA (up), ESC[nB (down) and ESC[2K (clear)."""
    lines, row, col = [""], 0, 0
    i = 0
    while i < len(raw):
        c = raw[i]
        m = re.match(r"\x1b\[(\d*)([A-Za-z])", raw[i:])
        if m:
            n = int(m.group(1) or 1)
            if m.group(2) == "A":
                row = max(0, row - n)
            elif m.group(2) == "B":
                row += n
            elif m.group(2) == "K":
                lines[row] = ""
                col = 0
            i += m.end()
            while len(lines) <= row:
                lines.append("")
            continue
        if c == "\r":
            col = 0
        elif c == "\n":
            row += 1
            col = 0
            while len(lines) <= row:
                lines.append("")
        elif c.isprintable():
            line = lines[row].ljust(col)
            lines[row] = line[:col] + c + line[col + 1:]
            col += 1
        i += 1
    return [l.rstrip() for l in lines if l.strip()]


def main() -> None:
    raw = open(sys.argv[1], encoding="utf-8", errors="replace", newline="").read()
    lines = screen(raw)
    if len(sys.argv) > 3:
        lines = lines[-int(sys.argv[3]):]
    font = ImageFont.truetype("/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf", 15)
    w = max(font.getlength(l) for l in lines) + 24
    h = 22 * len(lines) + 20
    img = Image.new("RGB", (int(w), h), (30, 30, 30))
    draw = ImageDraw.Draw(img)
    for n, line in enumerate(lines):
        draw.text((12, 10 + 22 * n), line, font=font, fill=(230, 230, 230))
    img.save(sys.argv[2])


if __name__ == "__main__":
    main()
