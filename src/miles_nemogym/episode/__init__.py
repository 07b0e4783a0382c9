"""One NeMo-Gym episode: build the ``/run`` request, send it, classify the answer into the record."""
