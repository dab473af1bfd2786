"""`kvstore experiment list/run/plot`: a thin click layer over the registry in
kvstore.experiments; each experiment parses its own options (argparse), so they
are passed through unchanged after its name."""
import click

from kvstore import experiments
from kvstore.experiments import common

# options click does not know (the experiment's own) are passed on in ARGS
PASS_THROUGH = {"ignore_unknown_options": True}


def _find(name):
    try:
        return experiments.find(name)
    except LookupError as e:
        raise click.UsageError(str(e)) from None


def _prog(verb, name):
    return f"kvstore experiment {verb} {name} [--]"


@click.group()
def experiment():
    """The experiments that reproduce the papers' tables and figures (pNNN_: paper NNN of
    shared/papers) and kvstore's own measurements (kv_).

    Each writes its CSV first, as points finish, then draws the PNG from it, into a
    fresh directory ./kvstore-results/NAME-<date>-<time> (--out DIR to choose one,
    $KVSTORE_RESULTS likewise). Only --update-results writes into the repository's
    results/ (the committed files the README quotes)."""


@experiment.command("list")
def list_():
    """Every experiment: name, paper, what it measures."""
    for e in experiments.EXPERIMENTS:
        click.echo(f"{e.name:24s} {e.paper:4s} {e.description}")


@experiment.command(context_settings=PASS_THROUGH)
@click.argument("name")
@click.option("--quick", is_flag=True,
              help="smoke scale (seconds to a minute): the experiment's QUICK options, before ARGS")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(name, quick, args):
    """Run experiment NAME; ARGS go to the experiment.

    Without --quick it runs at full scale (minutes; the README's numbers). Results go to
    a new ./kvstore-results/NAME-<date>-<time>; ARGS `--out DIR` chooses the directory,
    `--update-results` replaces the committed results/NAME.csv and .png (not with --quick:
    smoke-scale numbers must not replace them). Options after NAME (put them after `--` if
    one of them is --quick or --help) are the experiment's own and override the --quick
    ones; `kvstore experiment run NAME -- --help` lists them with their defaults."""
    mod = _find(name).module()
    argv = list(args)
    if quick:
        if "--update-results" in argv:
            raise click.UsageError("--quick with --update-results would replace the full-scale results in "
                                   "results/ with smoke-scale ones: give --out DIR, or run without --quick")
        argv = list(mod.QUICK) + argv
    common.main(mod, argv, prog=_prog("run", name))


@experiment.command(context_settings=PASS_THROUGH)
@click.argument("name")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def plot(name, args):
    """Redraw experiment NAME's PNG from its CSV (and print its summary); nothing is measured.

    The CSV is read from ARGS' `--out DIR` (the PNG is written beside it), by default from
    the committed results/ (the PNG then goes to a new ./kvstore-results/NAME-<date>-<time>;
    `--update-results` redraws results/NAME.png itself). ARGS go to the experiment, e.g.
    `--tag p16` for NAME_p16.csv."""
    mod = _find(name).module()
    common.main(mod, ["--plot-only", *args], prog=_prog("plot", name))
