"""A driver that breaks the protocol on purpose, one way per $HOSTILE value (tests/test_protocol.py)."""

import json
import os
import sys
import time

import numpy as np

from operations.driver import drive
from operations.protocol import DriverRequest

MODE = os.environ.get("HOSTILE", "none")


def make_inputs(case, rng, device):
    return {"x": rng.standard_normal((case["rows"], case["cols"]))}


def run(impl, inputs):
    return impl.softmax(inputs["x"])


def reference(case, inputs):
    x = inputs["x"]
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def main() -> int:
    req = DriverRequest.model_validate_json(open(sys.argv[1]).read())
    if MODE == "crash":
        raise RuntimeError("driver crashed on purpose")
    if MODE == "hang":
        time.sleep(3600)
    if MODE == "no_result":
        return 0
    if MODE == "outside":
        for target in (
            "/etc/cko-was-here",
            "/cko/harness/cko-was-here",
            "/cko/subjects/original/cko-was-here",
            "/opt/cko/cko-was-here",
            "/cko-was-here",
        ):
            try:
                open(target, "w").write("x")
                print(f"WROTE {target}")
            except OSError as exc:
                print(f"blocked {target}: {exc.strerror}")
    if MODE == "megabytes":
        sys.stdout.write("y" * (8 << 20))
        sys.stdout.flush()
    res = drive(req, make_inputs, run, reference).model_dump(mode="json")
    if MODE == "garbage":
        open(req.result_path, "w").write("this is not json {")
        return 0
    if MODE == "wrong_unit":
        res["units"] = {k: "s" for k in res["units"]}
    if MODE == "too_few":
        for s in res["series"]:
            s["reps"] = s["reps"][:1]
            s["samples"] = {k: v[:1] for k, v in s["samples"].items()}
    if MODE == "nan":
        res["series"][0]["samples"]["time"][0] = float("nan")
    if MODE == "wrong_metric":
        for s in res["series"]:
            s["samples"] = {"latency": next(iter(s["samples"].values()))}
    if MODE == "protocol":
        res["protocol"] = "cko/driver-v9"
    if MODE == "missing_subject":
        res["series"] = []
    with open(req.result_path, "w") as f:
        json.dump(res, f)  # json.dump writes NaN as NaN: the contract check must catch it
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
