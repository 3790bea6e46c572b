module github.com/shizu-gpu/shizu/cmd/shizu

go 1.26.8
