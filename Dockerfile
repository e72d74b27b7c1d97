# Switchyard's container image: the static binary of `make release` on an empty base.
#
#   make image                     # builds dist/switchyard-VERSION-linux-ARCH, then this file
#   podman build --build-arg BINARY=dist/switchyard-v1.0.0-linux-amd64 -t switchyard:v1.0.0 .
#
# The binary is built on the host (CGO_ENABLED=0, so it needs no libc), which keeps the build
# free of compiler images and registries. The image has no shell, no CA bundle and no
# /etc/passwd: mount a CA bundle at /etc/ssl/certs/ca-certificates.crt (or set SSL_CERT_FILE)
# for https engines signed by a public CA.
FROM scratch

ARG BINARY=dist/switchyard-linux-amd64
COPY ${BINARY} /usr/local/bin/switchyard

# The conventional unprivileged "nonroot" IDs; deploy/kubernetes/deployment.yaml runs as them.
USER 65532:65532

# server.port's default. Inside a container set server.host to 0.0.0.0 (the default,
# 127.0.0.1, is reachable only from the container itself).
EXPOSE 8080

ENTRYPOINT ["/usr/local/bin/switchyard"]
CMD ["serve", "--config", "/etc/switchyard/switchyard.yaml"]
