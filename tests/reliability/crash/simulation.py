"""A simulation that logs every execution: ``simulation.py LOG ROUND INDEX`` (candidate on stdin).

Appends one JSON line per run to LOG (O_APPEND: one write per line, so lines from
killed or concurrent runs never interleave), then prints ``{"value": ...}``.
"""

import json
import os
import sys

log, round_index, index = sys.argv[1:4]
candidate = json.loads(sys.stdin.read())
line = json.dumps({"round": int(round_index), "index": int(index), "candidate": candidate})
fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
try:
    os.write(fd, (line + "\n").encode())
finally:
    os.close(fd)
print(json.dumps({"value": sum((float(v) - 0.3) ** 2 for v in candidate)}))
