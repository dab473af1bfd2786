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

    Each writes its CSV first, as points finish, then draws the PNG from it, under
    results/ (or $KVSTORE_RESULTS)."""


@experiment.command("list")
def list_():
    """Every experiment: name, paper, what it measures."""
    for e in experiments.EXPERIMENTS:
        click.echo(f"{e.name:24s} {e.paper:4s} {e.description}")


@experiment.command(context_settings=PASS_THROUGH)
@click.argument("name")
@click.option("--quick", is_flag=True,
              help="smoke scale (seconds to a minute), into a temporary directory unless $KVSTORE_RESULTS "
                   "is set: never over the full-scale files in results/")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(name, quick, args):
    """Run experiment NAME; ARGS go to the experiment.

    Without --quick it runs at full scale (minutes; the README's numbers) and writes
    results/NAME.csv and .png. Options after NAME (put them after `--` if one of them
    is --quick or --help) are the experiment's own and override the --quick ones;
    `kvstore experiment run NAME -- --help` lists them."""
    mod = _find(name).module()
    argv = list(args)
    if quick:
        click.echo(f"quick run: results go to {common.quick_results_dir(name)}", err=True)
        argv = list(mod.QUICK) + argv
    common.main(mod, argv, prog=_prog("run", name))


@experiment.command(context_settings=PASS_THROUGH)
@click.argument("name")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def plot(name, args):
    """Redraw experiment NAME's PNG from its CSV (and print its summary); nothing is measured.

    ARGS go to the experiment, e.g. `--tag p16` for results/NAME_p16.csv."""
    mod = _find(name).module()
    common.main(mod, ["--plot-only", *args], prog=_prog("plot", name))
