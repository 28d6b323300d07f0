"""spark-submit entry point: `spark-submit [...] deploy/run_job.py --bootstrap ... --controllers ... --checkpoint ...`.

The master comes from spark-submit (`--master`); the job only sets it itself when run with plain python.
"""

import sys

from electra.streaming.job import main

if __name__ == "__main__":
    sys.exit(main())
