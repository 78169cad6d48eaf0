#!/usr/bin/env bash
# Render a run's report (if needed) and screenshot it with headless Chromium.
#
#   benchmarks/screenshot_report.sh RUN_DIR OUT_PNG [WIDTH] [HEIGHT]
#
# RUN_DIR: a fedseg run directory (summary.json, ...). report.html is (re)rendered from
# the run's files with fedseg.report.html.render_report. Headless Chromium shoots a
# fixed viewport, so the page is shot WIDTH x HEIGHT (HEIGHT large, default 12000) and
# the blank space below the page's end is trimmed off. A page longer than HEIGHT is cut
# (a warning says so): pass a larger HEIGHT. Needs the Debian package `chromium`
# (apt-get install -y chromium).
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 RUN_DIR OUT_PNG [WIDTH=1300] [HEIGHT=12000]" >&2
  exit 2
fi
run_dir=$(realpath "$1")
out_png=$(realpath -m "$2")
width=${3:-1300}
height=${4:-12000}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-$here/.venv/bin/python}
chrome=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [[ -z "$chrome" ]]; then
  echo "chromium not found: apt-get install -y chromium" >&2
  exit 1
fi

report=$("$python" -c 'import sys; from fedseg.report.html import render_report; print(render_report(sys.argv[1]))' "$run_dir")

profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
mkdir -p "$(dirname "$out_png")"
"$chrome" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --hide-scrollbars --user-data-dir="$profile" \
  --screenshot="$out_png" --window-size="$width,$height" "file://$report" 2>/dev/null

# Trim the white below the page's content (Pillow is a fedseg dependency).
"$python" - "$out_png" <<'PY'
import sys
import numpy as np
from PIL import Image

path = sys.argv[1]
im = Image.open(path).convert("RGB")
ink = np.flatnonzero((np.asarray(im) < 245).any(axis=(1, 2)))
bottom = int(ink[-1]) + 1 if ink.size else im.height
if bottom >= im.height - 1:
    print(f"warning: page longer than the {im.height}px viewport; pass a larger HEIGHT", file=sys.stderr)
im.crop((0, 0, im.width, min(im.height, bottom + 24))).save(path)
print(f"{path}: {im.width}x{min(im.height, bottom + 24)}")
PY
