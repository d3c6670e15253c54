"""How Gantry reaches a cluster and acts there for someone.

- ``cluster``: the cluster's keys and pinned host key on disk, pooled transports (the
  service account's, and each user's own account's);
- ``identities``: which cluster account a Gantry user's work runs as, and the credentials
  Gantry acts with (the cluster's user CA, or per-user key pairs); ``admin`` and ``api``
  are their admin pages and REST API;
- ``signer`` and ``signer_client``: user certificates signed by a worker, so the web
  processes never read a CA's private key; ``ca_rotation``: a new CA without a moment when
  logins fail.
"""
