# redrive: build with the bundled librdkafka, run as a non-root user on a slim image.
FROM rust:1-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake pkg-config \
      libssl-dev zlib1g-dev libzstd-dev python3 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY migrations ./migrations
COPY examples ./examples
RUN cargo build --release --locked --bin redrive

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 zlib1g libzstd1 curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin redrive
COPY --from=build /src/target/release/redrive /usr/local/bin/redrive
USER redrive
# 9464: /metrics, /healthz, /readyz; 9465: the admin API.
EXPOSE 9464 9465
ENTRYPOINT ["/usr/local/bin/redrive"]
CMD ["run"]
