module github.com/memwall/memwall

go 1.26.0

require (
	github.com/ebitengine/purego v0.11.3 // indirect
	github.com/prometheus/client_golang v1.25.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
