#!/bin/sh
# The proxy's certificate, run by the nginx image's entry point before nginx starts
# (mounted into /docker-entrypoint.d/ by deploy/compose.yaml).
# A certificate mounted at $TLS_DIR (tls.crt and tls.key, docs/deploy.md) is used as it
# is. Without one, a self-signed certificate for $PUBLIC_HOST is made once and kept in
# the volume, so that a browser's exception for it lasts across restarts: enough to keep
# passwords, cookies and tokens off the wire from the first start, not to prove to a
# browser who the server is (it warns until a real certificate is mounted).
set -eu
TLS_DIR="${TLS_DIR:-/etc/nginx/certs}"
HOST="${PUBLIC_HOST:-localhost}"
if [ -s "$TLS_DIR/tls.crt" ] && [ -s "$TLS_DIR/tls.key" ]; then
    echo "tls-certificate: using $TLS_DIR/tls.crt"
    exit 0
fi
if ! command -v openssl >/dev/null; then
    echo "tls-certificate: no certificate in $TLS_DIR and no openssl to make one: mount" \
         "tls.crt and tls.key there (docs/deploy.md)" >&2
    exit 1
fi
case "$HOST" in
    *[!0-9.]*) SAN="DNS:$HOST" ;;
    *) SAN="IP:$HOST" ;;
esac
[ "$HOST" = localhost ] && SAN="$SAN,IP:127.0.0.1"
umask 077
openssl req -x509 -newkey rsa:2048 -sha256 -nodes -days "${TLS_SELF_SIGNED_DAYS:-825}" \
    -subj "/CN=$HOST" -addext "subjectAltName=$SAN" \
    -keyout "$TLS_DIR/tls.key.new" -out "$TLS_DIR/tls.crt.new" 2>/dev/null
mv "$TLS_DIR/tls.key.new" "$TLS_DIR/tls.key"
chmod 644 "$TLS_DIR/tls.crt.new"
mv "$TLS_DIR/tls.crt.new" "$TLS_DIR/tls.crt"
echo "tls-certificate: made a self-signed certificate for $HOST in $TLS_DIR (mount a real" \
     "one for browsers to trust it: docs/deploy.md)"
