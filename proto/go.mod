module github.com/shizu-gpu/shizu/proto

go 1.26.8

require google.golang.org/protobuf v1.36.12

tool google.golang.org/protobuf/cmd/protoc-gen-go
