"""The web dashboard's use case: what each page shows, and to whom.

`views` builds plain view objects from the same API parts the `jobs` function answers with (so a
page shows a caller exactly what the API would), `usage` sums a window of jobs through its own
port, `teams` gives each team's chips now and its month against its budget, `output_tail` reads
workers' last lines from their newest chunks, `charts` turns times and sums into SVG geometry,
and `caller` says who is asking (IAP's signed header). The HTML is
`tpujobs.runtime.dashboard_site`'s.
"""
