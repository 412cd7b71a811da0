"""Which notebooks the next rehearsed profile must run, from what the earlier rehearsals read.

``make rehearse`` rehearses the profiles one after another (``t4``, ``h100-80gb``, ``8xh100``), each with
``$GPUFORMER_PROFILE_READS`` set to ``READS/<profile>``, so every notebook's kernel, and every process it starts,
notes which fields of the rehearsed profile it read and where (:data:`gpuformer_lib.profiles.PROFILE_READS_ENV`).
A notebook is deterministic code whose only knowledge of the GPU is that profile: if every field it read under
an earlier profile has the same value in the next one, it takes the same path there, and rehearsing it again
would run the same code on the same values. So a notebook is rehearsed under the next profile unless some
earlier rehearsal of it read only fields the two profiles share. The first profile has no earlier one: every
notebook runs. A notebook with no record of its reads is rehearsed::

    python -m gpuformer_lib.tools.rehearsal_plan READS --profile h100-80gb notebooks/*.ipynb

prints the notebooks to rehearse, one per line, and on stderr why each one is rehearsed (the fields that
differ, and where each was first read) or left out.

What this cannot see: a choice made from something other than the profile, such as reading
``$GPUFORMER_REHEARSE`` directly (the library reads it only through :mod:`gpuformer_lib.profiles`), and reads
inside :func:`~gpuformer_lib.profiles.display_only` blocks, which only make text for the reader.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuformer_lib.profiles import PROFILES, profiles_differ_on


def fields_read(folder: Path) -> dict[str, set[str]] | None:
    """{field: where it was first read, ``file:line``, by each process} from the records in ``folder`` (a
    file per process, a line ``field<TAB>where`` per field), or None when there is no record."""
    if not folder.is_dir():
        return None
    fields: dict[str, set[str]] = {}
    for record in folder.glob("*.txt"):
        for line in record.read_text(encoding="utf-8").splitlines():
            field, _, where = line.strip().partition("\t")
            if field:
                fields.setdefault(field, set()).add(where or "?")
    return fields


def plan(reads: Path, profile: str, notebooks: list[str], leave_out: dict[str, str] | None = None
         ) -> tuple[list[str], list[str]]:
    """(notebooks to rehearse under ``profile``, a line per notebook saying why it is rehearsed or left out),
    from the reads the earlier rehearsals recorded in ``reads/<earlier profile>/<notebook stem>/``.
    ``leave_out``: {notebook: why} left out under this profile whatever they read (said on their line, with the
    fields they read that would have rehearsed them)."""
    if profile not in PROFILES:
        raise ValueError(f"{profile!r} is not a profile; choose one of {', '.join(PROFILES)}")
    earlier = sorted(p.name for p in reads.iterdir() if p.is_dir() and p.name in PROFILES and p.name != profile)
    leave_out = leave_out or {}
    unknown = sorted(set(leave_out) - set(notebooks))
    if unknown:
        raise ValueError(f"left out but not a notebook to plan: {', '.join(unknown)}")
    run, why = [], []
    for notebook in notebooks:
        stem, reasons, same_as = Path(notebook).stem, [], None
        for before in earlier:
            fields = fields_read(reads / before / stem)
            if fields is None:
                continue
            differing = sorted(set(fields) & profiles_differ_on(PROFILES[before], PROFILES[profile]))
            if not differing:
                same_as = (before, fields)
                break
            reasons.append(f"under {before} it read " + ", ".join(
                f"{field} ({', '.join(sorted(fields[field]))})" for field in differing))
        if same_as is not None:
            before, fields = same_as
            why.append(f"left out: {notebook}: under {before} it read only {', '.join(sorted(fields)) or 'no field'}"
                       f", the same in {profile}")
        elif notebook in leave_out:
            why.append(f"LEFT OUT BY REQUEST: {notebook}: {leave_out[notebook]} (" +
                       ("; ".join(reasons) if reasons else "no earlier record of its reads") + ")")
        else:
            run.append(notebook)
            why.append(f"rehearsed: {notebook}: " + ("; ".join(reasons) if reasons else "no earlier record of its "
                                                     "reads"))
    return run, why


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reads", type=Path,
                        help="the folder whose <profile> subfolders the earlier rehearsals recorded their reads in")
    parser.add_argument("--profile", required=True, help="the profile to rehearse next")
    parser.add_argument("--leave-out", action="append", default=[], metavar="PROFILE:NOTEBOOK:WHY",
                        help="leave NOTEBOOK out under PROFILE, saying WHY (for a path another test rehearses)")
    parser.add_argument("notebooks", nargs="+")
    args = parser.parse_args(argv)
    if not args.reads.is_dir():
        parser.error(f"{args.reads} is not a folder")
    leave_out = {}
    for spec in args.leave_out:
        profile, notebook, reason = (spec.split(":", 2) + ["", ""])[:3]
        if not (profile and notebook and reason):
            parser.error(f"--leave-out takes PROFILE:NOTEBOOK:WHY, got {spec!r}")
        if profile == args.profile:
            leave_out[notebook] = reason
    try:
        run, why = plan(args.reads, args.profile, args.notebooks, leave_out)
    except ValueError as error:
        parser.error(str(error))
    print(f"-- which notebooks to rehearse under {args.profile} ({len(run)} of {len(args.notebooks)}):",
          file=sys.stderr)
    for line in why:
        print(f"   {line}", file=sys.stderr)
    print("\n".join(run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
