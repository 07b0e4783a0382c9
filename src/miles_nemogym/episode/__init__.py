"""The ``/run`` pipeline: ``run.run_episode`` builds one episode's request (``request``), sends
it (``in_flight``, ``circuit``, ``client``), classifies the answer (``classify``) and finishes
the record (``record``) that the hooks read back."""
