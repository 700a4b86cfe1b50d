"""The dashboard's pages, rendered on the server: jobs (``dashboard``), experiments, models and the
team's parts, with their static files (``static/``). They read the job service and the API's views,
never the store."""
