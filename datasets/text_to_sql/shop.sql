-- A small shop database for the text-to-SQL example. Built in memory for each query.
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT NOT NULL);
CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL,
                       price REAL NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
                     product_id INTEGER NOT NULL REFERENCES products(id), quantity INTEGER NOT NULL,
                     ordered_on TEXT NOT NULL);
INSERT INTO customers VALUES
  (1, 'Ada', 'UK'), (2, 'Grace', 'US'), (3, 'Linus', 'FI'), (4, 'Margaret', 'US'),
  (5, 'Guido', 'NL'), (6, 'Barbara', 'US');
INSERT INTO products VALUES
  (1, 'Keyboard', 'hardware', 49.0), (2, 'Mouse', 'hardware', 19.5), (3, 'Monitor', 'hardware', 189.0),
  (4, 'IDE licence', 'software', 99.0), (5, 'Compiler book', 'books', 39.9), (6, 'Type theory', 'books', 54.0);
INSERT INTO orders VALUES
  (1, 1, 1, 1, '2026-01-03'), (2, 1, 5, 2, '2026-01-10'), (3, 2, 3, 1, '2026-02-01'),
  (4, 2, 4, 3, '2026-02-14'), (5, 3, 2, 5, '2026-03-02'), (6, 4, 6, 1, '2026-03-09'),
  (7, 5, 4, 1, '2026-03-15'), (8, 6, 1, 2, '2026-04-01'), (9, 6, 2, 2, '2026-04-01'),
  (10, 2, 5, 1, '2026-04-20');
