"""`electra cert`: the CA, node certificates and role tokens of a real deployment (like `cockroach cert`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def cmd_cert(args: argparse.Namespace) -> int:
    from .auth import create_token, revoke_tokens
    from .node_security import TOKENS_FILE
    from .pki import create_ca, create_node_cert, node_cert_paths

    if not args.certs_dir.strip():
        print("error: --certs-dir must not be empty (it would be the current directory)", file=sys.stderr)
        return 2
    if getattr(args, "name", "x") is not None and not getattr(args, "name", "x").strip():
        print("error: --name must not be empty (the audit log and revocation name the holder by it)", file=sys.stderr)
        return 2
    d = Path(args.certs_dir)
    for option, path in (("--certs-dir", args.certs_dir), ("--out-dir", getattr(args, "out_dir", None))):
        if path and Path(path).exists() and not Path(path).is_dir():  # not "[Errno 17] File exists" from mkdir
            print(f"error: {option} {path} is a file, not a directory", file=sys.stderr)
            return 2
    try:
        if args.action == "create-ca":
            cid = create_ca(d, cluster_id=args.cluster_id, days=args.days, overwrite=args.overwrite)
            print(f"CA and cluster id {cid} in {d} (ca.crt is the bundle to distribute; keep ca.key safe)")
        elif args.action == "create-node":
            existing = node_cert_paths(Path(args.out_dir) if args.out_dir else d, args.id)[1]
            if existing.exists() and not args.overwrite:
                print(f"error: {existing} exists (use --overwrite to issue node {args.id} a new key and certificate; "
                      "the node picks them up on its next certificate reload or restart)", file=sys.stderr)
                return 1
            crt, key = create_node_cert(d, args.id, args.host or ["127.0.0.1", "localhost"], days=args.days,
                                        out_dir=args.out_dir)
            print(f"node {args.id}: {crt} {key}")
        elif args.action == "create-token":
            if args.out:  # checked before the credential exists: a bad --out must not leave one no one holds
                out = Path(args.out)
                if out.is_dir():
                    raise ValueError(f"--out {out} is a directory: name the token's file")
                if not (os.access(out, os.W_OK) if out.exists() else
                        out.parent.is_dir() and os.access(out.parent, os.W_OK)):
                    raise ValueError(f"--out {out}: cannot write the token there")
            token = create_token(args.tokens_file or d / TOKENS_FILE, args.role, args.name,
                                 broker_sets=args.broker_set, clusters=args.cluster)
            if args.out:
                fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(token + "\n")
                print(f"{args.role} token for {args.name!r} written to {args.out} (ELECTRA_TOKEN_FILE={args.out})")
            else:
                print(token)
        else:  # revoke-token
            n = revoke_tokens(args.tokens_file or d / TOKENS_FILE, args.name, keep_newest=args.keep_newest)
            if n == 0 and not args.keep_newest:  # a misspelt name revoked nothing: say so in the exit code
                print(f"error: no credential named {args.name!r}", file=sys.stderr)
                return 1
            print(f"revoked {n} token(s) of {args.name!r}")
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def add_cert_command(sub) -> None:
    from .auth import ROLES

    c = sub.add_parser("cert", help="create the cluster CA, node certificates and role tokens")
    acts = c.add_subparsers(dest="action", required=True)

    def common(p):
        p.add_argument("--certs-dir", required=True, help="the certs directory (ca.crt, ca.key, cluster-id, ...)")
        return p

    p = common(acts.add_parser("create-ca", help="new CA and cluster id (with --overwrite: a CA rollover that "
                                                 "keeps the previous CA, and only it, in the ca.crt bundle)"))
    p.add_argument("--cluster-id", help="default: the existing one, else a new random id")
    p.add_argument("--days", type=int, minimum=1, maximum=36_500, default=3650, help="validity (1 to 36500)")
    p.add_argument("--overwrite", action="store_true")
    p = common(acts.add_parser("create-node", help="node certificate (Raft mutual TLS and HTTPS)"))
    p.add_argument("--id", type=int, minimum=1, maximum=999_999_999, required=True)
    p.add_argument("--host", action="append", help="address or DNS name clients dial (repeat; default loopback)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing key and certificate of this node")
    p.add_argument("--days", type=int, minimum=1, maximum=36_500, default=365, help="validity (1 to 36500)")
    p.add_argument("--out-dir", help="where to write node-<id>.crt/.key (default the certs dir)")
    p = common(acts.add_parser("create-token", help="a role credential: appends its hash to tokens.json, prints it"))
    p.add_argument("--role", required=True, choices=ROLES)
    p.add_argument("--name", required=True, help="who holds it (audit log, rotation and revocation use it)")
    p.add_argument("--broker-set", action="append", help="broker role: set name or pattern it may act for (repeat)")
    p.add_argument("--cluster", action="append", help="broker role: cluster name or pattern (default any)")
    p.add_argument("--tokens-file", help="default <certs-dir>/tokens.json")
    p.add_argument("--out", help="write the token to this file (mode 0600) instead of printing it")
    p = common(acts.add_parser("revoke-token", help="remove a holder's tokens (--keep-newest ends a rotation)"))
    p.add_argument("--name", required=True)
    p.add_argument("--keep-newest", action="store_true")
    p.add_argument("--tokens-file", help="default <certs-dir>/tokens.json")
    c.set_defaults(fn=cmd_cert)
