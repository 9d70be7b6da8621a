"""A simulation that fails on purpose: ``faulty_simulation.py PLAN ROUND INDEX``.

The candidate comes on stdin.

PLAN is a JSON file mapping ``"<round>:<index>"`` (or ``"verifier"`` for the
verifier's runs, which get ``{"x": [...]}`` and no round) to a fault:
``segv`` (kill itself with SIGSEGV), ``hang`` (sleep far past any timeout),
``exit`` (write to stderr, exit 3), ``text`` (print ``hi``, exit 0), ``nan``
(print ``{"value": NaN}``), ``novalue`` (print ``{"result": 1.0}``). The key
``"*"`` is the fault of every simulation the plan does not name. Anything else
computes the value.
"""

import json
import os
import signal
import sys
import time

plan_path, round_index, index = sys.argv[1:4]
data = json.loads(sys.stdin.read())
verifier = isinstance(data, dict)
candidate = data["x"] if verifier else data
with open(plan_path, encoding="utf-8") as plan_file:
    plan = json.loads(plan_file.read())
fault = plan.get("verifier") if verifier else plan.get(f"{round_index}:{index}", plan.get("*"))
if fault == "segv":
    os.kill(os.getpid(), signal.SIGSEGV)
elif fault == "hang":
    time.sleep(600)
elif fault == "exit":
    who = "verifier" if verifier else f"simulation {round_index}:{index}"
    print(f"{who} gave up: mesh did not converge", file=sys.stderr)
    sys.exit(3)
elif fault == "text":
    print("mesh written to out.vtk", file=sys.stderr)
    print("hi")
    sys.exit(0)
elif fault == "nan":
    print('{"value": NaN}')
    sys.exit(0)
elif fault == "novalue":
    print(json.dumps({"result": 1.0}))
    sys.exit(0)
print(json.dumps({"value": sum((float(v) - 0.3) ** 2 for v in candidate)}))
