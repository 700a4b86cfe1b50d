"""The train server's store: the one package that speaks SQL. ``database`` (``JobStore``: the SQLite
database, its connections, its versioned schema migrations, the jobs and their events), ``readers`` (the
reader connections), and the tables of a server a team shares and of Tune experiments. Everything else
in the server calls it; routes and pages never import it (an import contract says so)."""
