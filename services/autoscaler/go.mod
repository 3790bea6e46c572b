module github.com/shizu-gpu/shizu/services/autoscaler

go 1.26.8
