module github.com/shizu-gpu/shizu/services/metering

go 1.26.8
