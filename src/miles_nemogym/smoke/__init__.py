"""``miles-nemogym smoke``: the whole chain on a laptop (``run``) and the scripted policy it talks to (``policy``)."""

__all__: list[str] = []
