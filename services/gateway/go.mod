module github.com/shizu-gpu/shizu/services/gateway

go 1.26.8

require (
	github.com/shizu-gpu/shizu/proto v0.0.0
	github.com/shizu-gpu/shizu/shared v0.0.0
)

require (
	github.com/getkin/kin-openapi v0.153.0 // indirect
	golang.org/x/time v0.16.0 // indirect
)

replace github.com/shizu-gpu/shizu/shared => ../../shared

replace github.com/shizu-gpu/shizu/proto => ../../proto
