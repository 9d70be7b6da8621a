"""Run the demo objective as an executable: ``python -m tasks.demo.objective``.

The implementation lives in ``tasks.demo._objective``; this module is only the
entry point, so running it does not re-import a module the package already
loaded.
"""

import sys

from tasks.demo._objective import main

if __name__ == "__main__":
    sys.exit(main())
