"""The GitHub Actions workflow (``.github/workflows/ci.yml``) runs what the course says it runs: ``make test`` on
pushes and pull requests to main, with the same torch as ``.ci/run`` (the CPU build), Debian's Chromium for the
browser test, never ``playwright install`` (it downloads a browser), and the data sets fetched by the course's own
loader before the tests; ``make book``, with no torch installed before it (it needs none), packaged from
``_build/html`` for GitHub Pages and deployed only on a push to main, by a job with the permissions Pages needs,
one deployment at a time; every action pinned to a major version. GitHub itself cannot run here, so these checks
read the file; each rule is also tested on a copy of the workflow that breaks it, which it must reject."""

import copy
import re
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML comes with jupyter-book (make test installs it)")

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "ci.yml"


def load(path: Path = WORKFLOW) -> dict:
    """The workflow as a dict. YAML 1.1 reads the key ``on`` as True; it is put back under "on"."""
    workflow = yaml.safe_load(path.read_text())
    if True in workflow:
        workflow["on"] = workflow.pop(True)
    return workflow


def commands(step: dict) -> list[str]:
    """The shell commands of a step's ``run``: one per line, continuations joined, ``&&`` and ``;`` split."""
    text = re.sub(r"\\\n\s*", " ", step.get("run", ""))
    return [" ".join(part.split()) for line in text.splitlines() for part in re.split(r"&&|;", line) if part.strip()]


def steps_of(job: dict) -> list[dict]:
    """A job's steps ([] for a job that calls a reusable workflow)."""
    return job.get("steps", [])


def runs(job: dict, command: str) -> bool:
    """Whether a step of the job runs ``command`` as a command of its own (not inside a longer one)."""
    return any(command in commands(step) for step in steps_of(job))


def uses(step: dict, action: str) -> bool:
    """Whether a step runs ``action`` (owner/name), at any version."""
    return step.get("uses", "").partition("@")[0] == action


def jobs_that(workflow: dict, test) -> list[str]:
    """The names of the jobs for which ``test(job)`` holds."""
    return [name for name, job in workflow.get("jobs", {}).items() if test(job)]


def condition(text) -> str:
    """An ``if:`` expression without ``${{ }}`` and extra spaces, quotes made single."""
    text = str(text or "").strip()
    if text.startswith("${{") and text.endswith("}}"):
        text = text[3:-2]
    return " ".join(text.replace('"', "'").split())


def only_on_push_to_main(expression: str) -> bool:
    """Whether an ``if:`` expression holds only for a push to main: both tests present, joined by ``&&`` only."""
    return ("||" not in expression and "!" not in expression.replace("!=", "")
            and re.search(r"github\.event_name == 'push'", expression) is not None
            and re.search(r"github\.ref == 'refs/heads/main'", expression) is not None)


def torch_pin(text: str) -> str | None:
    """The X.Y.Z of the first ``torch==X.Y.Z`` in ``text``, or None."""
    found = re.search(r"torch==([\w.+]+)", text)
    return found.group(1) if found else None


def problems(workflow: dict, ci_run: str) -> list[str]:
    """What is wrong with the workflow, in words; [] when it keeps every rule. ``ci_run`` is .ci/run's text."""
    found = []
    triggers = workflow.get("on") or {}
    for event in ("push", "pull_request"):
        branches = (triggers.get(event) or {}).get("branches", []) if isinstance(triggers, dict) else []
        if "main" not in branches:
            found.append(f"the workflow does not run on {event} to main")
    jobs = workflow.get("jobs", {})

    tests = jobs_that(workflow, lambda job: runs(job, "make test"))
    if not tests:
        found.append("no job runs `make test`")
    for name in tests:
        job = jobs[name]
        run_text = "\n".join(c for step in steps_of(job) for c in commands(step))
        pin, wanted = torch_pin(run_text), torch_pin(ci_run)
        if pin is None or pin != wanted:
            found.append(f"job {name!r} installs torch=={pin} where .ci/run installs torch=={wanted}")
        elif "download.pytorch.org/whl/cpu" not in run_text:
            found.append(f"job {name!r} does not take torch from PyTorch's CPU index (PyPI's is the CUDA build)")
        if not re.search(r"apt-get install\b.*\bchromium\b", run_text):
            found.append(f"job {name!r} does not install Debian's chromium for the browser test")
        order = [c for step in steps_of(job) for c in commands(step)]
        fetch = next((i for i, c in enumerate(order) if "data.data_path" in c and "data.DATASETS" in c), None)
        if fetch is None or fetch > order.index("make test"):
            found.append(f"job {name!r} does not fetch every data set with gpuformer_lib.data before `make test`")

    for name, job in jobs.items():
        for step in steps_of(job):
            if any(re.search(r"\bplaywright\s+install\b", c) for c in commands(step)):
                found.append(f"job {name!r} runs `playwright install`, which downloads a browser")
            action = step.get("uses")
            if action and not re.fullmatch(r"[\w.-]+/[\w./-]+@(v\d+|[0-9a-f]{40})", action):
                found.append(f"job {name!r} uses {action!r}, not pinned to a major version (@vN)")

    books = jobs_that(workflow, lambda job: runs(job, "make book"))
    if not books:
        found.append("no job runs `make book`")
    for name in books:
        job = jobs[name]
        build = next(i for i, step in enumerate(steps_of(job)) if "make book" in commands(step))
        if any("torch" in c for step in steps_of(job)[:build] for c in commands(step)):
            found.append(f"job {name!r} installs torch before `make book`, which needs none: the job would not "
                         "notice a build that came to need it")
        uploads = [(i, step) for i, step in enumerate(steps_of(job)) if uses(step, "actions/upload-pages-artifact")]
        if not any(i > build and str((step.get("with") or {}).get("path", "")).rstrip("/") == "_build/html"
                   for i, step in uploads):
            found.append(f"job {name!r} does not upload _build/html with actions/upload-pages-artifact after "
                         "`make book`")

    deploys = jobs_that(workflow, lambda job: any(uses(step, "actions/deploy-pages") for step in steps_of(job)))
    if not deploys:
        found.append("no job deploys with actions/deploy-pages")
    if not any(uses(step, "actions/configure-pages") for job in jobs.values() for step in steps_of(job)):
        found.append("no step runs actions/configure-pages")
    for name in deploys:
        job = jobs[name]
        deploy_steps = [step for step in steps_of(job) if uses(step, "actions/deploy-pages")]
        if not only_on_push_to_main(condition(job.get("if"))) and not all(
                only_on_push_to_main(condition(step.get("if"))) for step in deploy_steps):
            found.append(f"job {name!r} may deploy on something other than a push to main: "
                         f"if: {condition(job.get('if'))!r}")
        needs = job.get("needs", [])
        needs = [needs] if isinstance(needs, str) else needs
        if not set(books) & set(needs):
            found.append(f"job {name!r} does not wait for the job that builds the book")
        if not set(tests) & set(needs):
            found.append(f"job {name!r} may publish a book whose tests failed (it does not need the test job)")
        permissions = job.get("permissions") or workflow.get("permissions") or {}
        for scope in ("pages", "id-token"):
            if not isinstance(permissions, dict) or permissions.get(scope) != "write":
                found.append(f"job {name!r} lacks the permission {scope}: write")
        environment = job.get("environment")
        environment = environment.get("name") if isinstance(environment, dict) else environment
        if environment != "github-pages":
            found.append(f"job {name!r} does not deploy to the github-pages environment")
        group = job.get("concurrency") or workflow.get("concurrency")
        group = group.get("group") if isinstance(group, dict) else group
        if not group:
            found.append(f"job {name!r} has no concurrency group (two deployments could overlap)")
    return found


@pytest.fixture(scope="module")
def workflow() -> dict:
    return load()


@pytest.fixture(scope="module")
def ci_run() -> str:
    return (ROOT / ".ci" / "run").read_text()


def test_the_workflow_keeps_every_rule(workflow, ci_run):
    assert problems(workflow, ci_run) == []


def test_ci_run_pins_torch(ci_run):
    assert torch_pin(ci_run), ".ci/run no longer pins torch==X.Y.Z: the workflow cannot be checked against it"


def find_step(workflow: dict, test) -> dict:
    """The first step of any job for which ``test(step)`` holds."""
    return next(step for job in workflow["jobs"].values() for step in steps_of(job) if test(step))


def job_with(workflow: dict, action: str) -> dict:
    """The first job with a step that runs ``action``."""
    return next(job for job in workflow["jobs"].values() if any(uses(s, action) for s in steps_of(job)))


def no_make_test(wf):
    step = find_step(wf, lambda s: "make test" in commands(s))
    step["run"] = step["run"].replace("make test", "make rehearse")


def no_pull_requests(wf):
    del wf["on"]["pull_request"]


def other_torch(wf):
    step = find_step(wf, lambda s: "torch==" in s.get("run", "") and "apt-get" not in s.get("run", ""))
    step["run"] = re.sub(r"torch==[\w.+]+", "torch==2.6.0", step["run"], count=1)


def torch_from_pypi(wf):
    for job in wf["jobs"].values():
        for step in steps_of(job):
            if "run" in step:
                step["run"] = step["run"].replace("--index-url https://download.pytorch.org/whl/cpu", "")


def no_chromium(wf):
    step = find_step(wf, lambda s: "chromium" in s.get("run", ""))
    step["run"] = step["run"].replace("chromium", "fonts-liberation")


def playwright_downloads_a_browser(wf):
    step = find_step(wf, lambda s: "make test" in commands(s))
    step["run"] = ".venv/bin/python -m playwright install chromium\nmake test"


def data_fetched_after_the_tests(wf):
    job = next(j for j in wf["jobs"].values() if runs(j, "make test"))
    fetch = next(s for s in steps_of(job) if "data.data_path" in s.get("run", ""))
    job["steps"].remove(fetch)
    job["steps"].append(fetch)


def unpinned_action(wf):
    find_step(wf, lambda s: uses(s, "actions/checkout"))["uses"] = "actions/checkout@main"


def no_make_book(wf):
    step = find_step(wf, lambda s: "make book" in commands(s))
    step["run"] = ".venv/bin/jupyter-book build ."


def torch_before_the_book(wf):
    job = next(j for j in wf["jobs"].values() if runs(j, "make book"))
    build = next(i for i, s in enumerate(steps_of(job)) if "make book" in commands(s))
    job["steps"].insert(build, {"run": "python3 -m venv .venv\n.venv/bin/python -m pip install torch==2.13.0 "
                                       "--index-url https://download.pytorch.org/whl/cpu"})


def uploads_the_wrong_folder(wf):
    find_step(wf, lambda s: uses(s, "actions/upload-pages-artifact"))["with"]["path"] = "_build"


def deploys_on_pull_requests(wf):
    job = job_with(wf, "actions/deploy-pages")
    job["if"] = "github.ref == 'refs/heads/main' || github.event_name == 'pull_request'"


def deploys_from_any_branch(wf):
    job_with(wf, "actions/deploy-pages")["if"] = "github.event_name == 'push'"


def deploys_before_the_tests(wf):
    job = job_with(wf, "actions/deploy-pages")
    job["needs"] = [n for n in job["needs"] if n != next(k for k, j in wf["jobs"].items() if runs(j, "make test"))]


def lacks_id_token(wf):
    del job_with(wf, "actions/deploy-pages")["permissions"]["id-token"]


def pages_read_only(wf):
    job_with(wf, "actions/deploy-pages")["permissions"]["pages"] = "read"


def no_environment(wf):
    del job_with(wf, "actions/deploy-pages")["environment"]


def no_concurrency(wf):
    del job_with(wf, "actions/deploy-pages")["concurrency"]
    wf.pop("concurrency", None)


def no_configure_pages(wf):
    job = job_with(wf, "actions/deploy-pages")
    job["steps"] = [s for s in steps_of(job) if not uses(s, "actions/configure-pages")]


def no_deploy(wf):
    job = job_with(wf, "actions/deploy-pages")
    job["steps"] = [s for s in steps_of(job) if not uses(s, "actions/deploy-pages")]


BREAKS = {
    "no make test": (no_make_test, "no job runs `make test`"),
    "no pull requests": (no_pull_requests, "does not run on pull_request"),
    "another torch": (other_torch, "where .ci/run installs torch=="),
    "torch from PyPI": (torch_from_pypi, "CPU index"),
    "no chromium": (no_chromium, "Debian's chromium"),
    "playwright install": (playwright_downloads_a_browser, "downloads a browser"),
    "data after the tests": (data_fetched_after_the_tests, "before `make test`"),
    "unpinned action": (unpinned_action, "not pinned to a major version"),
    "no make book": (no_make_book, "no job runs `make book`"),
    "torch before the book": (torch_before_the_book, "which needs none"),
    "wrong folder uploaded": (uploads_the_wrong_folder, "does not upload _build/html"),
    "deploys on pull requests": (deploys_on_pull_requests, "other than a push to main"),
    "deploys from any branch": (deploys_from_any_branch, "other than a push to main"),
    "deploys before the tests": (deploys_before_the_tests, "whose tests failed"),
    "no id-token": (lacks_id_token, "id-token: write"),
    "pages read-only": (pages_read_only, "pages: write"),
    "no environment": (no_environment, "github-pages environment"),
    "no concurrency": (no_concurrency, "no concurrency group"),
    "no configure-pages": (no_configure_pages, "actions/configure-pages"),
    "no deploy": (no_deploy, "no job deploys"),
}


@pytest.mark.parametrize("name", list(BREAKS))
def test_each_rule_rejects_a_workflow_that_breaks_it(workflow, ci_run, name):
    breaks, message = BREAKS[name]
    broken = copy.deepcopy(workflow)
    breaks(broken)
    found = problems(broken, ci_run)
    assert any(message in problem for problem in found), found


def test_the_readme_badge_and_book_address_match_the_repository():
    """The README's badge points at this workflow and its book address at the Pages site of _config.yml's
    repository (https://github.com/OWNER/NAME -> https://OWNER.github.io/NAME/)."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    owner, name = re.fullmatch(r"https://github\.com/([\w.-]+)/([\w.-]+?)/?", config["repository"]["url"]).groups()
    readme = (ROOT / "README.md").read_text()
    assert f"https://github.com/{owner}/{name}/actions/workflows/{WORKFLOW.name}/badge.svg" in readme
    assert f"https://{owner.lower()}.github.io/{name}/" in readme
