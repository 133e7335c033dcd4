"""The node agent: a small daemon on every GPU machine (docs/architecture.md §6, docs/agent-protocol.md).

Standard library, aiohttp and nvidia-ml-py only; of the project it imports ``gpus`` and nothing else, so
it can be installed on a GPU machine on its own. ``agent.protocol`` (client, signing, workload spec) is the
one module of it the broker imports; the rest is the node side.
"""

__version__ = "0.1.0"
