"""``report_env`` served from this process (``flow.serve``), as deployments/serve.py serves specsweep's flows."""

from tests.helpers.env_flow import report_env

if __name__ == "__main__":
    report_env.serve(name="served")
