"""``fsedp results``: the tables of a results page (``docs/results.md``) regenerated from
the experiment files (:mod:`fsedp.experiments.results`); ``make results`` runs it."""

from fsedp.cli.common import positive, usage


def cmd_results(args):
    from fsedp.experiments.results import (
        check_experiment,
        check_page,
        experiment_files,
        update,
    )
    from fsedp.files import check_input_file, check_output_file, read_text

    for option, value in (("page", args.page), ("--experiments", args.experiments)):
        if value is not None and (not value.strip() or "\0" in value):
            raise usage(option, f"must name a file or folder, not {value[:40]!r}")
    page = check_input_file(args.page, "page")  # the read rule: a regular page, bounded
    if args.check:  # reads only: the page's folder need not be writable
        if args.only is not None:
            raise usage("--only", "applies to a regeneration, not to --check")
        files = experiment_files(args.experiments)
        for path in files.values():
            check_experiment(path)
        names = list(files)
        problems = check_page(read_text(page), names, page)
        for p in problems:
            print(p)
        if not problems:
            print(f"{page}: a block with a table for each of the {len(names)} experiment files")
        return 1 if problems else 0
    only = None
    if args.only is not None:
        only = [x.strip() for x in args.only.split(",") if x.strip()]
        if not only:
            raise usage("--only", "needs at least one experiment name (fig16,fig17)")
    from fsedp.cli.run import _executor

    check_output_file(page)  # a regeneration writes it: refused now, not after the runs
    update(page, args.experiments, only, **_executor(args))
    return 0


def add_parsers(sub):
    # a default in words below ("default: the model's") is none the parser holds: unset
    # (None), the command works it out; every other default and range is HelpFormatter's
    from fsedp.cli.run import _executor_arguments

    p = sub.add_parser(
        "results",
        help="regenerate the tables of a results page (docs/results.md) from the experiment "
        "files, or check that each file has its block",
    )
    p.add_argument(
        "page",
        help="the Markdown page; each table sits between '<!-- fsedp results: NAME -->' and "
        "'<!-- end fsedp results -->', NAME the experiment file's stem",
    )
    p.add_argument("--only", help="comma-separated names (fig16,fig17): these blocks only")
    p.add_argument(
        "--check",
        action="store_true",
        help="run nothing: check that every experiment file has a block with a table",
    )
    p.add_argument(
        "--experiments",
        help="folder of the experiment files (default: the project's configs/experiments)",
    )
    p.add_argument(
        "--workers",
        type=positive("--workers", 256),
        help="processes for each file's points (default: up to 2)",
    )
    _executor_arguments(p)
    p.set_defaults(func=cmd_results)
