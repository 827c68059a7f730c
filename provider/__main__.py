"""Entry point of the component provider (``PulumiPlugin.yaml`` next to this file).

The CLI starts it through the Python language host's ``RunPlugin`` (``python <this
directory> <engine address> ...``). It lives in a directory of its own because the checkout's
own ``__main__.py`` is the stack program: a plugin directory is run by its ``__main__.py``.
Everything it serves is in :mod:`pmem_components.provider_face` (its ``serve``).
"""

from importlib.metadata import version

from pmem_components.provider_face import serve

if __name__ == "__main__":
    serve(version=version("pmem-csi-pulumi"))
