"""The whole `tpujobs` command tree: the job verbs, then the groups mounted on them (dev, pool,
quota, secret, team, usage)."""

from __future__ import annotations

from tpujobs.cli.commands import app, describe_tables, jobs_table, watch_screen
from tpujobs.cli.demo import demo
from tpujobs.cli.dev_stack import dev_app
from tpujobs.cli.drill import drill
from tpujobs.cli.notifications import notify_key
from tpujobs.cli.pools import pool_app
from tpujobs.cli.quotas import quota_app
from tpujobs.cli.secrets import secret_app
from tpujobs.cli.teams import team_app
from tpujobs.cli.usage import usage_app

app.add_typer(dev_app, name="dev", help="The local stack: emulators, TPU simulator, functions.")
app.add_typer(pool_app, name="pool", help="Warm pools: capacity held under a name, for jobs that start in seconds.")
app.add_typer(
    quota_app, name="quota", help="Chip quotas per family, tier (on-demand, spot, reserved) and zone or region."
)
app.add_typer(secret_app, name="secret", help="Secrets for a job's `secrets` field, in Secret Manager.")
app.add_typer(team_app, name="team", help="Teams: members, accounts and shares of the chip quotas (admins).")
app.add_typer(usage_app, name="usage", help="Chip-hours, goodput and estimated cost per team, owner or label.")
app.command()(demo)
app.command()(drill)
app.command("notify-key")(notify_key)

__all__ = ["app", "describe_tables", "jobs_table", "watch_screen"]
