"""`make gpu-check` without a GPU, and its report when items pass, fail or crash."""

import json

from gpuformer_lib.tools import gpu_check


def test_without_a_gpu_it_exits_at_once_saying_so(capsys):
    assert gpu_check.main([]) == 2
    err = capsys.readouterr().err
    assert "needs an NVIDIA GPU" in err and "make rehearse" in err


def test_a_failing_or_crashing_item_fails_the_verdict_and_the_others_still_run(tmp_path):
    def crash():
        raise RuntimeError("boom")

    lines = []
    results = gpu_check.run_checks([("ok", lambda: (True, "")), ("crash", crash), ("bad", lambda: (False, "why")),
                                    ("after", lambda: (True, ""))], echo=lines.append)
    assert [r.passed for r in results] == [True, False, False, True]
    assert "RuntimeError: boom" in results[1].detail
    path = gpu_check.write_report(results, tmp_path)
    report = json.loads(path.read_text())
    assert report["verdict"] == "FAIL" and [i["name"] for i in report["items"]] == ["ok", "crash", "bad", "after"]
    assert report["device"]["torch_version"] and path.name.startswith("gpu-check-")
    assert gpu_check.write_report(results[:1], tmp_path) == path and json.loads(path.read_text())["verdict"] == "PASS"
