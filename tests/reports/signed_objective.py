"""A simulation whose objective crosses zero: ``signed_objective.py`` (candidate on stdin).

The squared distance to (0.3, 0.3, ...) minus 0.05, so candidates near that point
score below zero (a report must then draw the objective on a linear axis). The
batch sends the candidate as a list, the verifier as ``{"x": [...]}``.
"""

import json
import sys

sent = json.loads(sys.stdin.read())
candidate = sent["x"] if isinstance(sent, dict) else sent
print(json.dumps({"value": sum((float(v) - 0.3) ** 2 for v in candidate) - 0.05}))
